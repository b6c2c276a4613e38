"""What only the in-memory ledger has: the simulator's handles on its world.

The protocol's semantics are the conformance suite's (``test_conformance.py``, the same tests on
PostgreSQL); here: determinism, the restart of the server, a session that ends, the faults hook, the time a
lock wait charges to the world, the record of committed batches, and the error builders.
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy.exc import DBAPIError

from runner.memory_ledger import (
    InMemoryLedger,
    MemoryDatabase,
    blocked_error,
    error_fingerprint,
    shutdown_error,
    statement_timeout_error,
    unreachable_error,
)
from scrinalia.db.errors import classify_database_error
from scrinalia.domains.archive.ledger import FinishParams
from tests.ledger.conformance import VirtualClock, registration


def _world() -> tuple[VirtualClock, MemoryDatabase, InMemoryLedger]:
    clock = VirtualClock(datetime(2026, 12, 1, tzinfo=UTC))
    database = MemoryDatabase(clock, elapse=clock.advance)
    return clock, database, database.session(lock_timeout_s=1.0, name="runner")


def _history(steps: int = 20) -> tuple[list[tuple[object, ...]], str]:
    clock, database, session = _world()
    runner_id = uuid.UUID(int=1)
    session.register(registration(["a", "b"], runner_id=runner_id))
    out: list[tuple[object, ...]] = []
    for step in range(steps):
        session.enqueue("a" if step % 2 else "b", {"options": {"step": step}})
        run = session.claim_next(runner_id, ["a", "b"], 5)
        assert run is not None
        clock.advance(3 + step % 4)
        beat = session.heartbeat(runner_id, 5)
        expired = session.expire_leases()
        done = session.finish(run.run_id, runner_id, FinishParams("SUCCESS"))
        out.append((run.run_id, run.queued_at, tuple(beat.held), tuple(r.run_id for r in expired),
                    done.finished_at if done else None))
    return out, database.digest()


def test_the_same_history_twice_is_the_same() -> None:
    assert _history() == _history()
    assert _history(19)[1] != _history()[1]


def test_a_restart_breaks_every_open_transaction_and_frees_its_locks() -> None:
    _, database, session = _world()
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 60)
    assert run is not None
    child = database.session(lock_timeout_s=1.0, name="child")
    batch = child.begin_batch(run.run_id, runner_id)
    assert batch.register_fence()
    batch.lock_row()
    database.restart()
    assert not database.locks
    assert session.heartbeat(runner_id, 60).held == {run.run_id: None}  # not blocked any more
    with pytest.raises(DBAPIError) as broken:
        batch.commit()
    assert classify_database_error(broken.value) == "unreachable"
    assert database.committed_batches == []


def test_a_session_that_ends_rolls_its_batch_back() -> None:
    clock, database, session = _world()
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 60)
    assert run is not None
    child = database.session(lock_timeout_s=1.0, name="child")
    batch = child.begin_batch(run.run_id, runner_id)
    assert batch.register_fence()
    batch.lock_row()
    with pytest.raises(DBAPIError):
        session.heartbeat(runner_id, 60)
    child.close()  # the child died: its connection closed
    before = clock.now
    assert session.heartbeat(runner_id, 60).held == {run.run_id: None}
    assert clock.now == before  # nothing waited
    assert not batch.open and child.batches == []


def test_a_committed_batch_is_recorded_with_its_lease() -> None:
    clock, database, session = _world()
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 60)
    assert run is not None and run.lease_expires_at is not None
    batch = session.begin_batch(run.run_id, runner_id)
    assert batch.register_fence()
    batch.write({"rows": 3})
    clock.advance(2)
    batch.commit()
    (committed,) = database.committed_batches
    assert (committed.run_id, committed.runner_id, committed.payload) == (run.run_id, runner_id, ({"rows": 3},))
    assert committed.committed_at == clock.now < committed.lease_expires_at == run.lease_expires_at


def test_a_lock_wait_is_charged_to_the_world_in_slices_and_sees_an_early_release() -> None:
    clock = VirtualClock(datetime(2026, 12, 1, tzinfo=UTC))
    slices: list[float] = []
    holder: list[object] = []

    def elapse(seconds: float) -> None:  # the simulator's: time passes, other actors run
        slices.append(seconds)
        clock.advance(seconds)
        if len(slices) == 2:
            holder[0].release()  # type: ignore[attr-defined]

    database = MemoryDatabase(clock, elapse=elapse)
    session = database.session(lock_timeout_s=2.0)
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 60)
    assert run is not None
    holder.append(database.lock_row(run.run_id))
    start = clock.now
    beat = session.heartbeat(runner_id, 60)
    assert beat.held == {run.run_id: None}
    assert slices == [0.5, 0.5]  # a quarter of the bound each, then the lock was gone
    assert (clock.now - start).total_seconds() == 1.0
    assert beat.db_now == start  # now() is the statement's start, as in PostgreSQL


def test_a_lock_wait_past_the_bound_says_how_long_it_waited() -> None:
    clock, database, session = _world()
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 60)
    assert run is not None
    database.lock_row(run.run_id, "share")
    start = clock.now
    with pytest.raises(DBAPIError) as stuck:
        session.finish(run.run_id, runner_id, FinishParams("SUCCESS"))
    assert stuck.value.orig.waited_seconds == 1.0
    assert (clock.now - start).total_seconds() == 1.0


def test_without_a_moving_clock_a_wait_decides_at_once() -> None:
    moment = datetime(2026, 12, 1, tzinfo=UTC)
    database = MemoryDatabase(lambda: moment)
    session = database.session(lock_timeout_s=1.0)
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 60)
    assert run is not None
    lock = database.lock_row(run.run_id)
    with pytest.raises(DBAPIError) as stuck:
        session.heartbeat(runner_id, 60)
    assert stuck.value.orig.waited_seconds == 1.0
    lock.release()
    database.lock_row(run.run_id, release_after_s=0.5)
    assert session.heartbeat(runner_id, 60).held == {run.run_id: None}


class _Faults:
    def __init__(self) -> None:
        self.before_fails: set[str] = set()
        self.after_fails: set[str] = set()
        self.seen: list[tuple[str, str]] = []

    def before(self, session: InMemoryLedger, what: str) -> None:
        self.seen.append((session.name, what))
        if what in self.before_fails:
            raise unreachable_error(what)

    def after(self, session: InMemoryLedger, what: str) -> None:
        if what in self.after_fails:
            raise unreachable_error(what, "server closed the connection unexpectedly")


def test_the_faults_hook_fails_a_statement_before_or_after_it_took_effect() -> None:
    clock, database, _ = _world()
    faults = _Faults()
    session = database.session(lock_timeout_s=1.0, name="r1", faults=faults)
    runner_id = uuid.uuid4()
    session.register(registration(["w"], runner_id=runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 10)
    assert run is not None
    clock.advance(5)
    faults.before_fails = {"heartbeat"}
    with pytest.raises(DBAPIError) as refused:
        session.heartbeat(runner_id, 10)
    assert classify_database_error(refused.value) == "unreachable"
    assert database.by_run_id[run.run_id]["lease_expires_at"] == run.lease_expires_at  # never arrived
    faults.before_fails, faults.after_fails = set(), {"heartbeat"}
    with pytest.raises(DBAPIError):
        session.heartbeat(runner_id, 10)
    assert database.by_run_id[run.run_id]["lease_expires_at"] > run.lease_expires_at  # renewed, answer lost
    assert faults.seen[-2:] == [("r1", "heartbeat"), ("r1", "heartbeat")]
    with session.bounded(123.0):
        assert session.deadline == 123.0
    assert session.deadline is None


def test_the_error_builders_are_classified_as_the_real_ones() -> None:
    assert classify_database_error(blocked_error("x", 1.0)) == "blocked"
    assert classify_database_error(statement_timeout_error("x", 1.0)) == "blocked"
    assert classify_database_error(unreachable_error("x")) == "unreachable"
    assert classify_database_error(shutdown_error("x")) == "unreachable"


def test_the_clock_must_be_aware() -> None:
    database = MemoryDatabase(lambda: datetime(2026, 12, 1))
    with pytest.raises(ValueError):
        database.session(lock_timeout_s=1.0).enqueue("w", {})
    with pytest.raises(ValueError):
        database.session(lock_timeout_s=0)


def test_no_error_no_fingerprint() -> None:
    assert error_fingerprint(None) is None
