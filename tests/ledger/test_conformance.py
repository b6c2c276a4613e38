"""One suite, two adapters: every statement of the ledger port behaves the same on PostgreSQL and in memory.

Each test runs twice, against ``PostgresLedger`` on a fresh migrated database and against
``InMemoryLedger`` on a virtual clock (``tests/ledger/conformance.py``). What the simulator relies on
from the in-memory ledger is what PostgreSQL does here: the slot index, claim order, ``not_before``,
capabilities, ``SKIP LOCKED`` under a held lock, leases and their expiry on the database clock, fenced
statements, the heartbeat's answer, cancellation both ways, the batch fence at COMMIT, and a statement
that waits on another session's row lock failing ``blocked`` after its ``lock_timeout``, with the same
exception classes.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, timedelta
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError

from scrinalia.db.errors import classify_database_error
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import (
    InvalidRunRequest,
    RunAlreadyFinished,
    RunNotFound,
    WorkerRunAlreadyActive,
)
from scrinalia.domains.archive.ledger import FinishParams, StartParams, WorkerRun
from scrinalia.domains.archive.workers.sdk import LeaseLost, retry_database
from tests.ledger.conformance import LOCK_TIMEOUT_S, MemoryWorld, PostgresWorld, World, registration

SHORT_LEASE = 0.4  # seconds: leases the tests let run out on the database clock


@pytest.fixture(params=["postgres", "memory"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    made: PostgresWorld | MemoryWorld
    if request.param == "postgres":
        made = PostgresWorld(request.getfixturevalue("database_url"))
    else:
        made = MemoryWorld()
    yield made
    made.close()


def _runner(world: World, capabilities: list[str], *, lease: float = 60.0, heartbeat: float = 1.0) -> uuid.UUID:
    reg = registration(capabilities, lease=lease, heartbeat=heartbeat)
    world.ledger.register(reg)
    return reg.runner_id


def _claimed(world: World, worker: str = "w", lease: float = 60.0) -> tuple[WorkerRun, uuid.UUID]:
    runner_id = _runner(world, [worker])
    world.ledger.enqueue(worker, {})
    run = world.ledger.claim_next(runner_id, [worker], lease)
    assert run is not None
    return run, runner_id


def _blocked(exc: pytest.ExceptionInfo[DBAPIError]) -> None:
    assert classify_database_error(exc.value) == "blocked"
    assert getattr(exc.value.orig, "sqlstate", None) == "55P03"


# --- enqueue and the slot index ---------------------------------------------------------------------------


def test_enqueue_writes_a_queued_row_on_the_database_clock(world: World) -> None:
    run = world.ledger.enqueue("w", {"db_batch_size": 8, "options": {"k": (1, 2)}}, trigger="SCHEDULE",
                               requested_by="alice")
    assert (run.status, run.trigger, run.requested_by, run.attempt) == ("QUEUED", "SCHEDULE", "alice", 1)
    assert run.request == {"db_batch_size": 8, "options": {"k": [1, 2]}}  # through jsonb
    assert run.runner_id is None and run.started_at is None and run.not_before is None
    assert run.run_id.version == 7
    assert world.ledger.get_run(run.run_id) == run
    assert world.ledger.active_run("w") == run
    assert world.ledger.get_run(uuid.uuid4()) is None and world.ledger.active_run("nobody") is None


def test_enqueue_refuses_bad_input_before_writing(world: World) -> None:
    with pytest.raises(InvalidRunRequest):
        world.ledger.enqueue("", {})
    with pytest.raises(InvalidRunRequest):
        world.ledger.enqueue("w", {"nonsense": 1})
    with pytest.raises(InvalidRunRequest):
        world.ledger.enqueue("w", {}, trigger="CRON")
    with pytest.raises(InvalidRunRequest):
        world.ledger.enqueue("w", {}, attempt=0)
    assert world.ledger.active_run("w") is None


def test_the_slot_holds_one_queued_or_running_row_per_worker(world: World) -> None:
    first = world.ledger.enqueue("w", {})
    with pytest.raises(WorkerRunAlreadyActive) as taken:
        world.ledger.enqueue("w", {})
    assert taken.value.active == first
    runner_id = _runner(world, ["w"])
    claimed = world.ledger.claim_next(runner_id, ["w"], 60)
    assert claimed is not None
    with pytest.raises(WorkerRunAlreadyActive):
        world.ledger.create_running("w", {}, runner_id=runner_id, lease_seconds=60)
    world.ledger.enqueue("other", {})  # another worker's slot is its own
    assert world.ledger.finish(claimed.run_id, runner_id, FinishParams("SUCCESS")) is not None
    again = world.ledger.enqueue("w", {})  # the terminal row left the slot
    assert again.id > first.id


def test_a_retry_names_a_run_that_exists(world: World) -> None:
    with pytest.raises(IntegrityError):
        world.ledger.enqueue("w", {}, retry_of=uuid.uuid4(), attempt=2)
    first = world.ledger.enqueue("w", {})
    world.ledger.request_cancel(first.run_id)
    retry = world.ledger.enqueue("w", {}, retry_of=first.run_id, attempt=2)
    assert (retry.retry_of, retry.attempt) == (first.run_id, 2)


# --- claim ------------------------------------------------------------------------------------------


def test_claim_takes_the_oldest_queued_row_among_the_capabilities(world: World) -> None:
    runner_id = _runner(world, ["a", "b", "c"])
    a = world.ledger.enqueue("a", {})
    b = world.ledger.enqueue("b", {})
    c = world.ledger.enqueue("c", {})
    assert world.ledger.claim_next(runner_id, [], 60) is None
    assert world.ledger.claim_next(runner_id, ["zzz"], 60) is None
    got = [world.ledger.claim_next(runner_id, ["c", "b", "a"], 60) for _ in range(3)]
    assert [r.run_id if r else None for r in got] == [a.run_id, b.run_id, c.run_id]
    assert world.ledger.claim_next(runner_id, ["a", "b", "c"], 60) is None


def test_claim_sets_the_lease_on_the_database_clock(world: World) -> None:
    run, runner_id = _claimed(world, lease=37.5)
    assert (run.status, run.runner_id) == ("RUNNING", runner_id)
    assert run.started_at == run.heartbeat_at
    assert run.lease_expires_at is not None and run.heartbeat_at is not None
    assert run.lease_expires_at - run.heartbeat_at == timedelta(seconds=37.5)
    assert run.started_at >= run.queued_at


def test_claim_by_an_unregistered_runner_is_refused(world: World) -> None:
    world.ledger.enqueue("w", {})
    with pytest.raises(IntegrityError):
        world.ledger.claim_next(uuid.uuid4(), ["w"], 60)
    assert world.ledger.active_run("w").status == "QUEUED"


def test_claim_waits_for_not_before(world: World) -> None:
    runner_id = _runner(world, ["w"])
    run = world.ledger.enqueue("w", {}, not_before_delay_s=SHORT_LEASE)
    assert run.not_before is not None
    assert run.not_before - run.queued_at == timedelta(seconds=SHORT_LEASE)
    assert world.ledger.claim_next(runner_id, ["w"], 60) is None
    world.wait(SHORT_LEASE + 0.1)
    claimed = world.ledger.claim_next(runner_id, ["w"], 60)
    assert claimed is not None and claimed.run_id == run.run_id


@pytest.mark.parametrize("mode", ["update", "share"])
def test_claim_skips_a_row_another_session_holds_locked(world: World, mode: str) -> None:
    runner_id = _runner(world, ["a", "b"])
    a = world.ledger.enqueue("a", {})
    b = world.ledger.enqueue("b", {})
    with world.lock_row(a.run_id, mode):
        started = world.elapsed()
        got = world.ledger.claim_next(runner_id, ["a", "b"], 60)
        assert got is not None and got.run_id == b.run_id  # the older row is skipped, not waited on
        assert world.ledger.claim_next(runner_id, ["a"], 60) is None
        assert world.elapsed() - started < LOCK_TIMEOUT_S
    got = world.ledger.claim_next(runner_id, ["a"], 60)
    assert got is not None and got.run_id == a.run_id


# --- the one-shot CLI's row ---------------------------------------------------------------------------


def test_create_running_inserts_a_held_cli_row(world: World) -> None:
    runner_id = _runner(world, ["w"])
    run = world.ledger.create_running("w", {"options": {"x": 1}}, runner_id=runner_id, lease_seconds=20,
                                      requested_by="bob")
    assert (run.status, run.trigger, run.runner_id, run.requested_by) == ("RUNNING", "CLI", runner_id, "bob")
    assert run.lease_expires_at is not None and run.heartbeat_at is not None
    assert run.lease_expires_at - run.heartbeat_at == timedelta(seconds=20)
    assert world.ledger.heartbeat(runner_id, 20).held == {run.run_id: None}
    with pytest.raises(IntegrityError):
        world.ledger.create_running("v", {}, runner_id=uuid.uuid4(), lease_seconds=20)


# --- record_start, heartbeat, progress: fenced by runner_id = me AND RUNNING -----------------------------


def test_record_start_is_fenced(world: World) -> None:
    run, runner_id = _claimed(world)
    other = _runner(world, ["w"])
    fields: dict[str, Any] = {"engine_name": "e", "preset": "p", "config": {"db_batch_size": 3}, "options": {"o": True}}
    assert world.ledger.record_start(run.run_id, other, StartParams(**fields)) is False
    assert world.ledger.record_start(run.run_id, runner_id, StartParams(**fields)) is True
    row = world.ledger.get_run(run.run_id)
    assert row is not None
    assert (row.engine_name, row.preset, row.config, row.options) == ("e", "p", {"db_batch_size": 3}, {"o": True})
    world.ledger.finish(run.run_id, runner_id, FinishParams("FAILED"))
    assert world.ledger.record_start(run.run_id, runner_id, StartParams(**fields)) is False


def test_a_repeated_record_start_keeps_the_first_configuration(world: World) -> None:
    """The statement retried after its COMMIT's answer was lost: the run is still held, and its configuration
    is recorded once (its own row, decision 0394); the run's row takes the engine and preset again."""
    run, runner_id = _claimed(world)
    assert world.ledger.record_start(run.run_id, runner_id, StartParams("e", "p", {"first": 1}, {"o": 1}))
    assert world.ledger.record_start(run.run_id, runner_id, StartParams("e2", None, {"second": 2}, None))
    row = world.ledger.get_run(run.run_id)
    assert row is not None
    assert (row.engine_name, row.preset, row.config, row.options) == ("e2", None, {"first": 1}, {"o": 1})


def test_heartbeat_renews_the_registry_and_every_held_row(world: World) -> None:
    runner_id = _runner(world, ["a", "b"])
    world.ledger.enqueue("a", {})
    world.ledger.enqueue("b", {})
    a = world.ledger.claim_next(runner_id, ["a"], 5)
    b = world.ledger.claim_next(runner_id, ["b"], 5)
    assert a is not None and b is not None
    world.wait(0.05)
    beat = world.ledger.heartbeat(runner_id, 30, progress={a.run_id: {"done": 4}},
                                  children=[{"pid": 1, "run_id": str(a.run_id)}])
    assert beat.registry_renewed and beat.drain_requested_at is None
    assert beat.held == {a.run_id: None, b.run_id: None}
    assert beat.lease_expires_at - beat.db_now == timedelta(seconds=30)
    for run in (a, b):
        row = world.ledger.get_run(run.run_id)
        assert row is not None and row.lease_expires_at == beat.lease_expires_at
        assert row.heartbeat_at == beat.db_now and row.heartbeat_at is not None
        assert run.heartbeat_at is not None and row.heartbeat_at > run.heartbeat_at
    assert world.ledger.get_run(a.run_id).progress == {"done": 4}
    assert world.ledger.get_run(b.run_id).progress is None
    seen = world.runner(runner_id)
    assert seen is not None and seen.last_heartbeat_at == beat.db_now and seen.state == "online"
    assert seen.children == [{"pid": 1, "run_id": str(a.run_id)}]
    world.ledger.heartbeat(runner_id, 30)  # children None: the snapshot is kept
    assert world.runner(runner_id).children == seen.children


def test_heartbeat_of_someone_else_holds_nothing(world: World) -> None:
    run, _ = _claimed(world)
    stranger = _runner(world, ["w"])
    beat = world.ledger.heartbeat(stranger, 30)
    assert beat.registry_renewed and beat.held == {}
    unknown = world.ledger.heartbeat(uuid.uuid4(), 30)
    assert not unknown.registry_renewed and unknown.held == {} and unknown.drain_requested_at is None
    row = world.ledger.get_run(run.run_id)
    assert row is not None and row.lease_expires_at == run.lease_expires_at


def test_heartbeat_carries_the_drain_request(world: World) -> None:
    runner_id = _runner(world, ["w"])
    assert world.ledger.request_drain(runner_id, "ops") is True
    assert world.ledger.request_drain(uuid.uuid4(), "ops") is False
    beat = world.ledger.heartbeat(runner_id, 30)
    assert beat.drain_requested_at is not None and beat.drain_requested_at <= beat.db_now
    seen = world.runner(runner_id)
    assert seen is not None and seen.drain_requested_by == "ops"


def test_record_progress_writes_only_what_changed_on_held_rows(world: World) -> None:
    run, runner_id = _claimed(world)
    other = _runner(world, ["w"])
    assert world.ledger.record_progress(runner_id, {}) == 0
    assert world.ledger.record_progress(other, {run.run_id: {"done": 1}}) == 0
    assert world.ledger.record_progress(runner_id, {run.run_id: {"done": 1}}) == 1
    assert world.ledger.record_progress(runner_id, {run.run_id: {"done": 1}}) == 0  # unchanged
    assert world.ledger.record_progress(runner_id, {run.run_id: {"done": 2}, uuid.uuid4(): {"done": 9}}) == 1
    assert world.ledger.get_run(run.run_id).progress == {"done": 2}


# --- finish ----------------------------------------------------------------------------------------------


def test_finish_closes_the_held_row_once(world: World) -> None:
    run, runner_id = _claimed(world)
    other = _runner(world, ["w"])
    world.wait(0.05)
    assert world.ledger.finish(run.run_id, other, FinishParams("SUCCESS")) is None
    error = ("ValueError: run 550e8400-e29b-41d4-a716-446655440000 read /srv/data/x.csv at 0123456789abcdef0123"
             " in 12 ms\nTraceback line")
    done = world.ledger.finish(run.run_id, runner_id, FinishParams("FAILED", error=error + "x" * 3000, exit_code=3,
                               exit_reason="exception", metrics={"rows": 5}, result={"ok": 0},
                               progress={"done": 7}))
    assert done is not None
    assert (done.status, done.exit_code, done.exit_reason) == ("FAILED", 3, "exception")
    assert done.error is not None and len(done.error) == ledger.ERROR_MAX and done.error.startswith(error)
    assert done.error_fingerprint == "valueerror: run <uuid> read <path> at <hash> in <n> ms"
    assert (done.metrics, done.result, done.progress) == ({"rows": 5}, {"ok": 0}, {"done": 7})
    assert done.finished_at is not None and done.started_at is not None
    assert abs(done.duration_ms - (done.finished_at - done.started_at).total_seconds() * 1000) <= 1
    assert done.duration_ms >= 40
    assert world.ledger.finish(run.run_id, runner_id, FinishParams("SUCCESS")) is None  # once
    assert world.ledger.heartbeat(runner_id, 30).held == {}
    with pytest.raises(ValueError):
        world.ledger.finish(run.run_id, runner_id, FinishParams("RUNNING"))
    with pytest.raises(ValueError):
        world.ledger.finish(run.run_id, runner_id, FinishParams("FAILED", exit_reason="bored"))


def test_finish_keeps_progress_metrics_and_result_it_is_not_given(world: World) -> None:
    run, runner_id = _claimed(world)
    world.ledger.record_progress(runner_id, {run.run_id: {"done": 3}})
    done = world.ledger.finish(run.run_id, runner_id, FinishParams("SUCCESS"))
    assert done is not None and done.progress == {"done": 3} and done.metrics is None and done.error is None
    assert done.error_fingerprint is None
    second, other = _claimed(world, "v")
    failed = world.ledger.finish(second.run_id, other, FinishParams("FAILED",
                                 error="  OSError:\tno   such file '/var/x/y.bin' (errno 2)\nmore"))
    assert failed is not None and failed.error_fingerprint == "oserror: no such file '<path>' (errno <n>)"


# --- leases and their expiry, on the database clock --------------------------------------------------------


def test_expiry_interrupts_only_rows_past_their_lease(world: World) -> None:
    short, runner_id = _claimed(world, "short", lease=SHORT_LEASE)
    long_, _ = _claimed(world, "long", lease=60)
    assert world.ledger.expire_leases() == []
    world.wait(SHORT_LEASE + 0.1)
    (expired,) = world.ledger.expire_leases()
    assert (expired.run_id, expired.status, expired.exit_reason) == (short.run_id, "INTERRUPTED", "lease-lost")
    assert expired.error is not None and expired.error.startswith("LeaseExpired: the runner stopped renewing")
    assert short.heartbeat_at is not None
    assert short.heartbeat_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") in expired.error
    assert expired.error_fingerprint is not None and expired.duration_ms is not None
    assert world.ledger.get_run(long_.run_id).status == "RUNNING"
    assert world.ledger.expire_leases() == []
    # the holder lost it: every fenced statement touches nothing
    assert short.run_id not in world.ledger.heartbeat(runner_id, 60).held
    assert world.ledger.finish(short.run_id, runner_id, FinishParams("SUCCESS")) is None
    assert world.ledger.record_start(short.run_id, runner_id, StartParams(engine_name=None, preset=None, config=None,
                                     options=None)) is False
    assert world.ledger.record_progress(runner_id, {short.run_id: {"done": 1}}) == 0
    world.ledger.enqueue("short", {})  # the slot is free again


def test_a_heartbeat_keeps_the_lease_from_expiring(world: World) -> None:
    run, runner_id = _claimed(world, lease=SHORT_LEASE)
    for _ in range(3):
        world.wait(SHORT_LEASE / 2)
        assert world.ledger.heartbeat(runner_id, SHORT_LEASE).held == {run.run_id: None}
        assert world.ledger.expire_leases() == []
    assert world.elapsed() > SHORT_LEASE


def test_a_lapsed_lease_is_still_held_until_someone_expires_it(world: World) -> None:
    """The fence of the row statements is runner_id and status, not the lease: between the lease's end
    and the next expiry, the holder's heartbeat renews it and its finish closes it (only the batch fence
    reads the clock)."""
    run, runner_id = _claimed(world, lease=SHORT_LEASE)
    world.wait(SHORT_LEASE + 0.1)
    beat = world.ledger.heartbeat(runner_id, 60)
    assert beat.held == {run.run_id: None}
    assert world.ledger.expire_leases() == []
    second, other = _claimed(world, "v", lease=SHORT_LEASE)
    world.wait(SHORT_LEASE + 0.1)
    done = world.ledger.finish(second.run_id, other, FinishParams("SUCCESS"))
    assert done is not None and done.status == "SUCCESS"


def test_expiry_skips_a_row_another_session_holds_locked(world: World) -> None:
    run, _ = _claimed(world, lease=SHORT_LEASE)
    world.wait(SHORT_LEASE + 0.1)
    with world.lock_row(run.run_id, "update"):
        started = world.elapsed()
        assert world.ledger.expire_leases() == []
        assert world.elapsed() - started < LOCK_TIMEOUT_S  # skipped, not waited on
    (expired,) = world.ledger.expire_leases()
    assert expired.run_id == run.run_id


def test_an_expired_run_can_be_claimed_again_by_another_runner(world: World) -> None:
    run, first = _claimed(world, lease=SHORT_LEASE)
    world.wait(SHORT_LEASE + 0.1)
    world.ledger.expire_leases()
    second = _runner(world, ["w"])
    world.ledger.enqueue("w", {})
    again = world.ledger.claim_next(second, ["w"], 60)
    assert again is not None and again.runner_id == second and again.run_id != run.run_id
    assert world.ledger.heartbeat(first, 60).held == {}
    assert world.ledger.heartbeat(second, 60).held == {again.run_id: None}


# --- cancellation ----------------------------------------------------------------------------------------


def test_cancel_closes_a_queued_run_at_once(world: World) -> None:
    run = world.ledger.enqueue("w", {})
    cancelled = world.ledger.request_cancel(run.run_id, "alice")
    assert (cancelled.status, cancelled.exit_reason, cancelled.duration_ms) == ("CANCELLED", "cancelled", 0)
    assert cancelled.cancel_requested_by == "alice"
    assert cancelled.finished_at == cancelled.cancel_requested_at
    runner_id = _runner(world, ["w"])
    assert world.ledger.claim_next(runner_id, ["w"], 60) is None
    with pytest.raises(RunAlreadyFinished):
        world.ledger.request_cancel(run.run_id)
    with pytest.raises(RunNotFound):
        world.ledger.request_cancel(uuid.uuid4())
    world.ledger.enqueue("w", {})  # the slot is free


def test_cancel_flags_a_running_run_and_the_heartbeat_hands_it_over(world: World) -> None:
    run, runner_id = _claimed(world)
    flagged = world.ledger.request_cancel(run.run_id, "alice")
    assert flagged.status == "RUNNING" and flagged.cancel_requested_at is not None
    world.wait(0.05)
    again = world.ledger.request_cancel(run.run_id, "bob")  # the first request wins
    assert (again.cancel_requested_at, again.cancel_requested_by) == (flagged.cancel_requested_at, "alice")
    beat = world.ledger.heartbeat(runner_id, 60)
    assert beat.held == {run.run_id: flagged.cancel_requested_at}
    done = world.ledger.finish(run.run_id, runner_id, FinishParams("CANCELLED", exit_reason="cancelled"))
    assert done is not None and done.status == "CANCELLED"
    with pytest.raises(RunAlreadyFinished):
        world.ledger.request_cancel(run.run_id)


# --- the registry ---------------------------------------------------------------------------------------


def test_register_and_stop(world: World) -> None:
    reg = registration(["w"], lease=30, heartbeat=5, sees={"model_dirs": ["/models"], "model_roots": []})
    world.ledger.register(reg)
    seen = world.runner(reg.runner_id)
    assert seen is not None and (seen.state, seen.capabilities, seen.lease_seconds) == ("online", ["w"], 30)
    assert seen.sees == {"model_dirs": ["/models"], "model_roots": []}
    assert seen.devices == [{"index": 0, "name": "gpu"}]
    assert seen.started_at == seen.last_heartbeat_at and seen.children == []
    with pytest.raises(IntegrityError):
        world.ledger.register(reg)  # the same runner id twice
    with pytest.raises(IntegrityError):
        world.ledger.register(registration(["w"], lease=5, heartbeat=5))  # lease must exceed heartbeat
    assert world.ledger.stop(reg.runner_id) is True
    assert world.ledger.stop(reg.runner_id) is False
    assert world.ledger.stop(uuid.uuid4()) is False
    stopped = world.runner(reg.runner_id)
    assert stopped is not None and stopped.state == "stopped" and stopped.stopped_at is not None
    assert world.ledger.request_drain(reg.runner_id) is False


def test_a_runner_that_stops_renewing_goes_stale(world: World) -> None:
    runner_id = _runner(world, ["w"], lease=SHORT_LEASE, heartbeat=0.1)
    world.wait(SHORT_LEASE + 0.1)
    assert world.runner(runner_id).state == "stale"
    world.ledger.heartbeat(runner_id, SHORT_LEASE)
    assert world.runner(runner_id).state == "online"


def test_worker_settings_are_read_as_persisted(world: World) -> None:
    assert world.ledger.worker_settings("w") is None
    world.put_settings("w", {"engine_name": "e", "preset": None, "db_batch_size": 16, "options": {"a": 1},
                             "engine_options": {}})
    row = world.ledger.worker_settings("w")
    assert row is not None
    assert {k: row[k] for k in ("worker_name", "engine_name", "preset", "db_batch_size", "options",
                                "engine_options", "revision", "updated_by")} == {
        "worker_name": "w", "engine_name": "e", "preset": None, "db_batch_size": 16, "options": {"a": 1},
        "engine_options": {}, "revision": 1, "updated_by": "conformance"}
    assert isinstance(row["updated_at"], str)


def test_the_llm_check_rule_is_read_as_the_api_wrote_it(world: World) -> None:
    assert world.ledger.llm_check_rule() is None
    world.put_llm_check_rule("check", "echo", {"preset": "fast", "k": 1}, prompt="Is it right?")
    world.put_llm_check_rule("check-2", "echo", {"k": 2}, prompt="And now?")  # one active at a time
    rule = world.ledger.llm_check_rule()
    assert rule is not None
    assert {k: rule[k] for k in ("name", "engine_name", "engine_options", "prompt", "field")} == {
        "name": "check-2", "engine_name": "echo", "engine_options": {"k": 2}, "prompt": "And now?",
        "field": "title"}
    assert isinstance(rule["id"], int) and isinstance(rule["updated_at"], str)


def test_server_facts_are_what_the_first_connection_learned(world: World) -> None:
    world.ledger.get_run(uuid.uuid4())  # a first statement: the session has connected
    facts = world.ledger.server_facts()
    assert facts is not None
    assert facts.server_version_info >= (14,) and facts.default_schema_name == "public"
    assert facts.default_isolation_level == "READ COMMITTED" and facts.backslash_escapes is False


# --- the batch fence at COMMIT ----------------------------------------------------------------------------


def test_a_batch_inside_its_lease_commits(world: World) -> None:
    run, runner_id = _claimed(world)
    batch = world.ledger.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    batch.commit()


def test_a_batch_whose_lease_is_gone_is_refused_before_it_writes(world: World) -> None:
    run, runner_id = _claimed(world, lease=SHORT_LEASE)
    stranger = _runner(world, ["w"])
    batch = world.ledger.begin_batch(run.run_id, stranger)
    assert batch.register_fence() is False  # not held by this runner
    batch.rollback()
    world.wait(SHORT_LEASE + 0.1)
    late = world.ledger.begin_batch(run.run_id, runner_id)
    assert late.register_fence() is False  # past the lease, even before any expiry ran
    late.rollback()


def test_a_commit_after_the_lease_is_refused_as_the_sdk_maps_to_lease_lost(world: World) -> None:
    run, runner_id = _claimed(world, lease=SHORT_LEASE)
    batch = world.ledger.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    world.wait(SHORT_LEASE + 0.1)  # the child froze mid-batch; no expiry has run
    with pytest.raises(DBAPIError) as refused:
        batch.commit()
    assert ledger.is_batch_fence_refusal(refused.value)
    assert getattr(refused.value.orig, "sqlstate", None) == ledger.BATCH_FENCE_SQLSTATE
    assert classify_database_error(refused.value) == "error"  # not a database outage: the run is lost


    def attempt() -> None:
        raise refused.value  # what the SDK's retry loop sees from such a COMMIT
    with pytest.raises(LeaseLost, match="not held by runner"):
        retry_database("batch 1", attempt, 1.0)


@pytest.mark.parametrize("end", ["expired", "finished", "taken"])
def test_a_commit_after_the_run_was_lost_is_refused(world: World, end: str) -> None:
    run, runner_id = _claimed(world, lease=SHORT_LEASE if end != "finished" else 60)
    batch = world.ledger.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    if end == "finished":
        world.ledger.finish(run.run_id, runner_id, FinishParams("INTERRUPTED", exit_reason="lease-lost"))
    else:
        world.wait(SHORT_LEASE + 0.1)
        world.ledger.expire_leases()
        if end == "taken":
            other = _runner(world, ["w"])
            world.ledger.enqueue("w", {})
            assert world.ledger.claim_next(other, ["w"], 60) is not None
    with pytest.raises(DBAPIError) as refused:
        batch.commit()
    assert ledger.is_batch_fence_refusal(refused.value)


def test_a_commit_waits_on_a_row_held_for_update_then_fails_blocked(world: World) -> None:
    run, runner_id = _claimed(world)
    batch = world.ledger.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    with world.lock_row(run.run_id, "update"):
        started = world.elapsed()
        with pytest.raises(DBAPIError) as stuck:
            batch.commit()
        waited = world.elapsed() - started
    _blocked(stuck)
    assert waited >= ledger.BATCH_FENCE_LOCK_TIMEOUT_S - 0.05  # migration 0008's own bound, not the session's


def test_a_commit_passes_a_row_held_for_share(world: World) -> None:
    run, runner_id = _claimed(world)
    batch = world.ledger.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    with world.lock_row(run.run_id, "share"):
        batch.commit()


# --- a statement that must wait on another session's row lock ---------------------------------------------


@pytest.mark.parametrize("mode", ["update", "share"])
def test_a_statement_on_a_locked_row_fails_blocked_after_its_lock_timeout(world: World, mode: str) -> None:
    run, runner_id = _claimed(world)
    calls = {
        "heartbeat": lambda: world.ledger.heartbeat(runner_id, 60),
        "record_start": lambda: world.ledger.record_start(run.run_id, runner_id, StartParams(
            engine_name=None, preset=None, config={"k": 1}, options=None)),
        "record_progress": lambda: world.ledger.record_progress(runner_id, {run.run_id: {"done": 1}}),
        "request_cancel": lambda: world.ledger.request_cancel(run.run_id),
        "finish": lambda: world.ledger.finish(run.run_id, runner_id, FinishParams("SUCCESS")),
    }
    for statement, call in calls.items():
        with world.lock_row(run.run_id, mode):
            started = world.elapsed()
            with pytest.raises(DBAPIError) as stuck:
                call()
            waited = world.elapsed() - started
        _blocked(stuck)
        assert waited >= LOCK_TIMEOUT_S - 0.02, statement
        row = world.ledger.get_run(run.run_id)  # the failed statement changed nothing
        assert row is not None and row.status == "RUNNING" and row.lease_expires_at == run.lease_expires_at
        assert row.progress is None and row.config is None and row.cancel_requested_at is None, statement
    for call in calls.values():
        call()  # released: each goes through
    done = world.ledger.get_run(run.run_id)
    assert done is not None and done.status == "SUCCESS" and done.cancel_requested_at is not None
    assert (done.progress, done.config) == ({"done": 1}, {"k": 1})


def test_a_lock_released_within_the_bound_is_waited_for(world: World) -> None:
    run, runner_id = _claimed(world)
    with world.lock_row(run.run_id, "update", release_after_s=LOCK_TIMEOUT_S / 3):
        started = world.elapsed()
        beat = world.ledger.heartbeat(runner_id, 60)
        assert world.elapsed() - started >= LOCK_TIMEOUT_S / 3 - 0.02
    assert beat.held == {run.run_id: None}


def test_a_lock_on_someone_elses_row_does_not_block_my_heartbeat(world: World) -> None:
    theirs, _ = _claimed(world, "theirs")
    mine, runner_id = _claimed(world, "mine")
    with world.lock_row(theirs.run_id, "update"):
        assert world.ledger.heartbeat(runner_id, 60).held == {mine.run_id: None}
        assert world.ledger.finish(mine.run_id, runner_id, FinishParams("SUCCESS")) is not None


# --- a batch's own transaction: its locks, its session's bounds ----------------------------------------------


def test_a_registered_batch_holds_no_lock_on_its_run(world: World) -> None:
    """Decision 0100: between its fence's registration and its COMMIT a batch holds nothing on its run's
    row, so its runner's heartbeat, progress and finish go through at once (the simulator's mutant 1 and
    its SQL twin, bench/mutants/run_sql_twins.py, take the row FOR UPDATE at registration: this fails)."""
    run, runner_id = _claimed(world)
    child = world.session(lock_timeout_s=LOCK_TIMEOUT_S)
    batch = child.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    assert world.ledger.heartbeat(runner_id, 60).held == {run.run_id: None}
    assert world.ledger.record_progress(runner_id, {run.run_id: {"done": 1}}) == 1
    batch.commit()
    assert world.ledger.finish(run.run_id, runner_id, FinishParams("SUCCESS")) is not None




def test_a_batchs_own_row_lock_blocks_its_runners_heartbeat_not_its_commit(world: World) -> None:
    """What the batch fence did before migration 0008 (FOR UPDATE held to COMMIT): the heartbeat of the
    child's own runner waits on it and fails blocked; the batch's own COMMIT check does not."""
    run, runner_id = _claimed(world)
    child = world.session(lock_timeout_s=LOCK_TIMEOUT_S)
    batch = child.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    world.lock_in_batch(batch, run.run_id)
    with pytest.raises(DBAPIError) as stuck:
        world.ledger.heartbeat(runner_id, 60)
    _blocked(stuck)
    batch.commit()
    assert world.ledger.heartbeat(runner_id, 60).held == {run.run_id: None}


def test_an_idle_batch_loses_its_transaction_and_its_locks(world: World) -> None:
    """A child frozen mid-batch: its session's idle_in_transaction_session_timeout ends the transaction,
    the runner's heartbeat waiting on its row lock goes through, and the late COMMIT fails."""
    run, runner_id = _claimed(world)
    child = world.session(lock_timeout_s=LOCK_TIMEOUT_S, idle_in_transaction_s=0.1)
    runner = world.session(lock_timeout_s=2.0)
    batch = child.begin_batch(run.run_id, runner_id)
    assert batch.register_fence() is True
    world.lock_in_batch(batch, run.run_id)
    started = world.elapsed()
    assert runner.heartbeat(runner_id, 60).held == {run.run_id: None}
    assert world.elapsed() - started >= 0.1 - 0.02
    world.wait(0.05)
    with pytest.raises(DBAPIError) as gone:
        batch.commit()
    assert getattr(gone.value.orig, "sqlstate", None) == "25P03"  # idle_in_transaction_session_timeout
    assert classify_database_error(gone.value) == "blocked"
    assert not ledger.is_batch_fence_refusal(gone.value)
