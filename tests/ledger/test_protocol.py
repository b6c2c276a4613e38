"""Every protocol statement of the ledger and its fence, on a real PostgreSQL."""
from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import (
    InvalidRunRequest,
    RunAlreadyFinished,
    RunNotFound,
    WorkerRunAlreadyActive,
)
from scrinalia.domains.archive.ledger import FinishParams, StartParams
from tests.ledger.helpers import register_runner


def _count(engine, where: str = "true") -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM archive_worker_runs WHERE {where}")).scalar_one()


def _claimed(engine, worker: str = "embedding", lease: float = 60):
    me = register_runner(engine, [worker], lease=lease)
    queued = ledger.enqueue(engine, worker, {"db_batch_size": 10})
    run = ledger.claim_next(engine, me, [worker], lease)
    assert run is not None and run.run_id == queued.run_id
    return me, run


def test_enqueue_writes_a_durable_queued_row(engine):
    run = ledger.enqueue(engine, "embedding", {"preset": "cpu", "options": {"x": 1}}, requested_by="ana")
    assert run.status == "QUEUED" and run.trigger == "API" and run.runner_id is None
    assert run.request == {"preset": "cpu", "options": {"x": 1}}
    assert run.attempt == 1 and run.requested_by == "ana"
    assert ledger.get_run(engine, run.run_id) == run


def test_the_slot_refuses_a_second_active_run_and_frees_when_terminal(engine):
    first = ledger.enqueue(engine, "ner", {})
    with pytest.raises(WorkerRunAlreadyActive) as queued_busy:
        ledger.enqueue(engine, "ner", {})
    assert queued_busy.value.active.run_id == first.run_id

    me = register_runner(engine, ["ner"])
    claimed = ledger.claim_next(engine, me, ["ner"], 60)
    with pytest.raises(WorkerRunAlreadyActive) as running_busy:
        ledger.enqueue(engine, "ner", {})
    assert running_busy.value.active.status == "RUNNING"
    assert _count(engine, "worker_name = 'ner'") == 1

    assert ledger.finish(engine, claimed.run_id, me, FinishParams("SUCCESS")) is not None
    second = ledger.enqueue(engine, "ner", {})
    assert second.status == "QUEUED" and second.run_id != first.run_id
    # Another worker's slot was never involved.
    assert ledger.enqueue(engine, "typology", {}).status == "QUEUED"


def test_claim_sets_lease_from_database_clock_and_respects_capabilities(engine):
    me = register_runner(engine, ["cleaning"])
    ledger.enqueue(engine, "embedding", {})
    assert ledger.claim_next(engine, me, ["cleaning"], 30) is None
    assert ledger.claim_next(engine, me, [], 30) is None
    queued = ledger.enqueue(engine, "cleaning", {})
    run = ledger.claim_next(engine, me, ["cleaning"], 30)
    assert run.run_id == queued.run_id and run.status == "RUNNING" and run.runner_id == me
    assert run.started_at == run.heartbeat_at
    assert (run.lease_expires_at - run.heartbeat_at).total_seconds() == pytest.approx(30)
    assert ledger.claim_next(engine, me, ["cleaning"], 30) is None


def test_claim_waits_for_not_before(engine):
    me = register_runner(engine, ["embedding"])
    ledger.enqueue(engine, "embedding", {}, trigger="SCHEDULE", attempt=2, not_before_delay_s=3600)
    assert ledger.claim_next(engine, me, ["embedding"], 60) is None
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = now() - interval '1 second'"))
    assert ledger.claim_next(engine, me, ["embedding"], 60) is not None


def test_claim_takes_the_oldest_first(engine):
    me = register_runner(engine, ["a", "b", "c"])
    runs = [ledger.enqueue(engine, name, {}) for name in ("b", "c", "a")]
    claimed = [ledger.claim_next(engine, me, ["a", "b", "c"], 60).run_id for _ in runs]
    assert claimed == [r.run_id for r in runs]


def test_record_start_is_fenced_by_runner_and_status(engine):
    me, run = _claimed(engine)
    stranger = register_runner(engine, ["embedding"], name="stranger")
    effective: dict[str, Any] = {"engine_name": "minilm", "preset": "cpu", "config": {"model": "m"},
                                 "options": {"k": 1}}
    assert ledger.record_start(engine, run.run_id, stranger, StartParams(**effective)) is False
    assert ledger.get_run(engine, run.run_id).engine_name is None
    assert ledger.record_start(engine, run.run_id, me, StartParams(**effective)) is True
    row = ledger.get_run(engine, run.run_id)
    assert (row.engine_name, row.preset, row.config, row.options) == ("minilm", "cpu", {"model": "m"}, {"k": 1})
    ledger.finish(engine, run.run_id, me, FinishParams("SUCCESS"))
    assert ledger.record_start(engine, run.run_id, me, StartParams(**effective)) is False


def test_finish_is_fenced_and_records_exit_fields(engine):
    me, run = _claimed(engine)
    stranger = register_runner(engine, ["embedding"], name="stranger")
    assert ledger.finish(engine, run.run_id, stranger, FinishParams("SUCCESS")) is None
    assert ledger.get_run(engine, run.run_id).status == "RUNNING"

    done = ledger.finish(
        engine, run.run_id, me, FinishParams("FAILED",
        error="RuntimeError: CUDA error at /opt/x/y.py line 42", exit_code=None, exit_signal=11,
        exit_reason="signal", metrics={"peak_rss_bytes": 1234}, result={"processed": 3}))
    assert done.status == "FAILED" and done.exit_signal == 11 and done.exit_reason == "signal"
    assert done.finished_at >= done.started_at and done.duration_ms >= 0
    assert done.error_fingerprint == "runtimeerror: cuda error at <path> line <n>"
    assert done.metrics == {"peak_rss_bytes": 1234} and done.result == {"processed": 3}
    # A second finish (a zombie, or a retry of the statement) touches nothing.
    assert ledger.finish(engine, run.run_id, me, FinishParams("SUCCESS")) is None
    assert ledger.get_run(engine, run.run_id).status == "FAILED"


def test_finish_truncates_a_long_error(engine):
    me, run = _claimed(engine)
    done = ledger.finish(engine, run.run_id, me, FinishParams("FAILED", error="ValueError: " + "x" * 5000,
                                                                  exit_reason="exception"))
    assert done.error is not None and len(done.error) == 2000 and done.error.startswith("ValueError: ")


def test_heartbeat_renews_only_own_rows_and_reports_cancel_and_drain(engine):
    me, mine = _claimed(engine, "embedding", lease=5)
    other = register_runner(engine, ["ner"], name="other")
    ledger.enqueue(engine, "ner", {})
    theirs = ledger.claim_next(engine, other, ["ner"], 5)
    before_theirs = ledger.get_run(engine, theirs.run_id).lease_expires_at

    beat = ledger.heartbeat(engine, me, 120, progress={mine.run_id: {"done": 3, "total": 10, "unit": "document"}},
                            children=[{"pid": 42, "run_id": str(mine.run_id)}])
    assert beat.registry_renewed and set(beat.held) == {mine.run_id} and beat.held[mine.run_id] is None
    row = ledger.get_run(engine, mine.run_id)
    assert row.progress == {"done": 3, "total": 10, "unit": "document"}
    assert (row.lease_expires_at - beat.db_now).total_seconds() == pytest.approx(120)
    assert ledger.get_run(engine, theirs.run_id).lease_expires_at == before_theirs

    ledger.request_cancel(engine, mine.run_id, requested_by="ana")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runners SET drain_requested_at = now() WHERE runner_id = :r"),
                     {"r": me})
    beat = ledger.heartbeat(engine, me, 120)
    assert beat.held[mine.run_id] is not None and beat.drain_requested_at is not None
    assert ledger.get_run(engine, mine.run_id).progress == {"done": 3, "total": 10, "unit": "document"}


def test_heartbeat_from_a_stranger_touches_nothing(engine):
    me, run = _claimed(engine)
    before = ledger.get_run(engine, run.run_id)
    ghost = uuid.uuid4()  # never registered
    beat = ledger.heartbeat(engine, ghost, 60)
    assert not beat.registry_renewed and beat.held == {}
    assert ledger.get_run(engine, run.run_id) == before


def test_a_lost_row_is_missing_from_the_heartbeat(engine):
    me, run = _claimed(engine, lease=60)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 second'"))
    assert [r.run_id for r in ledger.expire_leases(engine)] == [run.run_id]
    beat = ledger.heartbeat(engine, me, 60)
    assert beat.registry_renewed and run.run_id not in beat.held
    assert ledger.finish(engine, run.run_id, me, FinishParams("SUCCESS")) is None


def test_expire_leases_marks_only_expired_running_rows(engine):
    me = register_runner(engine, ["a", "b", "c", "d"])
    for name in ("a", "b", "c"):
        ledger.enqueue(engine, name, {})
    expired = ledger.claim_next(engine, me, ["a"], 60)
    alive = ledger.claim_next(engine, me, ["b"], 60)
    finished = ledger.claim_next(engine, me, ["c"], 60)
    ledger.finish(engine, finished.run_id, me, FinishParams("SUCCESS"))
    queued = ledger.enqueue(engine, "d", {})
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 second' "
                 "WHERE run_id IN (:a, :c)"),
            {"a": expired.run_id, "c": finished.run_id},
        )
    result = ledger.expire_leases(engine)
    assert [r.run_id for r in result] == [expired.run_id]
    row = ledger.get_run(engine, expired.run_id)
    assert row.status == "INTERRUPTED" and row.exit_reason == "lease-lost" and row.finished_at is not None
    assert row.error.startswith("LeaseExpired:") and row.error_fingerprint.startswith("leaseexpired:")
    assert ledger.get_run(engine, alive.run_id).status == "RUNNING"
    assert ledger.get_run(engine, finished.run_id).status == "SUCCESS"
    assert ledger.get_run(engine, queued.run_id).status == "QUEUED"
    assert ledger.expire_leases(engine) == []


def test_request_cancel_closes_a_queued_run_at_once(engine):
    queued = ledger.enqueue(engine, "typology", {})
    cancelled = ledger.request_cancel(engine, queued.run_id, requested_by="ana")
    assert cancelled.status == "CANCELLED" and cancelled.exit_reason == "cancelled"
    assert cancelled.cancel_requested_at is not None and cancelled.cancel_requested_by == "ana"
    assert cancelled.finished_at is not None
    # The slot is free again.
    assert ledger.enqueue(engine, "typology", {}).status == "QUEUED"


def test_request_cancel_only_flags_a_running_run(engine):
    me, run = _claimed(engine)
    flagged = ledger.request_cancel(engine, run.run_id, requested_by="ana")
    assert flagged.status == "RUNNING" and flagged.cancel_requested_at is not None
    assert flagged.finished_at is None and flagged.runner_id == me
    again = ledger.request_cancel(engine, run.run_id, requested_by="bob")
    assert again.cancel_requested_at == flagged.cancel_requested_at and again.cancel_requested_by == "ana"
    done = ledger.finish(engine, run.run_id, me, FinishParams("CANCELLED", exit_reason="cancelled"))
    with pytest.raises(RunAlreadyFinished) as ended:
        ledger.request_cancel(engine, run.run_id)
    assert ended.value.run.status == done.status == "CANCELLED"
    with pytest.raises(RunNotFound):
        ledger.request_cancel(engine, uuid.uuid4())


def test_create_running_is_the_cli_claim(engine):
    cli = register_runner(engine, ["cleaning"], kind="cli")
    run = ledger.create_running(engine, "cleaning", {"db_batch_size": 5}, runner_id=cli, lease_seconds=30,
                                requested_by="operator")
    assert run.status == "RUNNING" and run.trigger == "CLI" and run.runner_id == cli
    assert (run.lease_expires_at - run.started_at).total_seconds() == pytest.approx(30)
    with pytest.raises(WorkerRunAlreadyActive):
        ledger.create_running(engine, "cleaning", {}, runner_id=cli, lease_seconds=30)


def test_active_and_last_runs(engine):
    me = register_runner(engine, ["a", "b"])
    first = ledger.enqueue(engine, "a", {})
    ledger.claim_next(engine, me, ["a"], 60)
    ledger.finish(engine, first.run_id, me, FinishParams("FAILED", error="boom"))
    active = ledger.enqueue(engine, "a", {})
    view = ledger.active_and_last_runs(engine, ["a", "b"])
    assert view["a"][0]["run_id"] == str(active.run_id) and view["a"][1]["run_id"] == str(first.run_id)
    assert view["b"] == (None, None)
    assert ledger.active_run(engine, "a").run_id == active.run_id


@pytest.mark.parametrize(
    ("worker", "request_", "field"),
    [
        ("", {}, "worker_name"),
        ("   ", {}, "worker_name"),
        ("w" * 101, {}, "worker_name"),
        ("embedding", ["not", "an", "object"], "request"),
        ("embedding", "preset=cpu", "request"),
        ("embedding", {"db_batch_size": 0}, "db_batch_size"),
        ("embedding", {"db_batch_size": 10_001}, "db_batch_size"),
        ("embedding", {"db_batch_size": "10"}, "db_batch_size"),
        ("embedding", {"db_batch_size": True}, "db_batch_size"),
        ("embedding", {"options": [1, 2]}, "options"),
        ("embedding", {"engine_name": ""}, "engine_name"),
        ("embedding", {"surprise": 1}, "surprise"),
    ],
)
def test_bad_input_is_a_typed_error_and_writes_nothing(engine, worker, request_, field):
    with pytest.raises(InvalidRunRequest) as err:
        ledger.enqueue(engine, worker, request_)
    assert err.value.field == field and field in str(err.value)
    assert _count(engine) == 0


def test_batch_size_bounds_are_accepted(engine):
    assert ledger.enqueue(engine, "a", {"db_batch_size": 1}).request["db_batch_size"] == 1
    assert ledger.enqueue(engine, "b", {"db_batch_size": 10_000}).request["db_batch_size"] == 10_000
    assert ledger.enqueue(engine, "w" * 100, {}).worker_name == "w" * 100
