"""The batch fence is checked at COMMIT and holds no lock while a batch is open (issue 9; decision 0100).

In-process, with threads and real sessions of a real PostgreSQL: a batch is opened through
``RunContext.commit`` and held open inside its ``write`` (what a child frozen mid-commit leaves behind),
while another session runs the protocol's statements under a short ``lock_timeout``.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.workers.sdk import LeaseLost, LocalChannel, ResolvedConfig, RunContext
from tests.ledger.helpers import register_runner

LOCK_BOUND_MS = 1500


@pytest.fixture
def probe(engine: Engine) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE fence_probe (run_id uuid, batch int)"))
    return engine


@pytest.fixture
def bounded(database_url: str) -> Iterator[Engine]:
    """Another process's sessions would see it the same way: a lock wait longer than the bound fails."""
    eng = create_engine_from_url(database_url, connect_args={"options": f"-c lock_timeout={LOCK_BOUND_MS}"})
    yield eng
    eng.dispose()


def _claimed(engine: Engine, lease: float) -> tuple[ledger.WorkerRun, uuid.UUID]:
    runner_id = register_runner(engine, ["w"], lease=lease)
    ledger.enqueue(engine, "w", {})
    run = ledger.claim_next(engine, runner_id, ["w"], lease)
    assert run is not None
    return run, runner_id


def _context(engine: Engine, run: ledger.WorkerRun) -> RunContext:
    config = ResolvedConfig(engine_name=None, preset=None, db_batch_size=1, options={}, engine_options={}, config={})
    return RunContext(run, config, engine, LocalChannel())


def _write(run_id: uuid.UUID, hold: threading.Event | None = None, entered: threading.Event | None = None):
    def write(conn):
        conn.execute(text("INSERT INTO fence_probe (run_id, batch) VALUES (:r, 1)"), {"r": run_id})
        if entered is not None:
            entered.set()
        if hold is not None:
            assert hold.wait(60)
        return "written"
    return write


def _open_batch(engine: Engine, run: ledger.WorkerRun):
    """A batch started on a thread and held open inside its transaction, after its write: ``(thread, hold,
    entered, outcome)``; ``hold.set()`` lets it commit; ``outcome["value"]`` is its result or its error."""
    hold, entered = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def batch():
        try:
            outcome["value"] = _context(engine, run).commit(_write(run.run_id, hold, entered))
        except BaseException as exc:
            outcome["value"] = exc

    thread = threading.Thread(target=batch)
    thread.start()
    return thread, hold, entered, outcome


def _probes(engine: Engine, run_id: uuid.UUID) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM fence_probe WHERE run_id = :r"), {"r": run_id}).scalar_one()


def test_a_batch_inside_its_lease_commits_and_leaves_no_fence_row(probe):
    run, _ = _claimed(probe, 60)
    assert _context(probe, run).commit(_write(run.run_id)) == "written"
    assert _probes(probe, run.run_id) == 1
    with probe.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archive_batch_fences")).scalar_one() == 0


def test_a_batch_whose_lease_ends_while_it_is_open_is_refused_at_commit(probe):
    """The old fence checked the lease when the batch began: this batch committed 1 s after its lease."""
    run, _ = _claimed(probe, 60)
    thread, hold, entered, outcome = _open_batch(probe, run)
    assert entered.wait(30)
    with probe.begin() as conn:  # the lease ends while the batch is open (nobody expires the row)
        conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = clock_timestamp() + interval '0.3 s' "
                          "WHERE run_id = :r"), {"r": run.run_id})
    time.sleep(1.0)
    hold.set()
    thread.join(30)
    assert isinstance(outcome["value"], LeaseLost), outcome
    assert "at commit" in str(outcome["value"])
    assert _probes(probe, run.run_id) == 0  # nothing of the batch landed
    assert ledger.get_run(probe, run.run_id).status == "RUNNING"


def test_a_batch_of_a_lost_lease_is_refused_before_it_writes(probe):
    run, runner_id = _claimed(probe, 60)
    with probe.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 s' WHERE run_id = :r"),
                     {"r": run.run_id})
    calls: list[int] = []
    with pytest.raises(LeaseLost):
        _context(probe, run).commit(lambda conn: calls.append(1))
    assert calls == []


def test_the_commit_time_check_raises_its_own_sqlstate(probe):
    run, runner_id = _claimed(probe, 60)
    with pytest.raises(DBAPIError) as caught:
        with probe.begin() as conn:
            assert ledger.register_batch_fence(conn, run.run_id, runner_id)
            conn.execute(text("UPDATE archive_worker_runs SET status = 'INTERRUPTED', finished_at = now() "
                              "WHERE run_id = :r"), {"r": run.run_id})
    assert ledger.is_batch_fence_refusal(caught.value)
    assert caught.value.orig.sqlstate == ledger.BATCH_FENCE_SQLSTATE


def test_an_open_batch_holds_nothing_the_protocol_waits_on(probe, bounded):
    """Issue 9, defects 1 and 2: the old fence's FOR UPDATE made every one of these wait on the row."""
    run, runner_id = _claimed(probe, 4)
    thread, hold, entered, outcome = _open_batch(probe, run)
    try:
        assert entered.wait(30)
        started = time.monotonic()
        beat = ledger.heartbeat(bounded, runner_id, 4)
        assert run.run_id in beat.held
        assert ledger.record_progress(bounded, runner_id, {run.run_id: {"done": 1}}) == 1
        assert ledger.expire_leases(bounded) == []
        with bounded.begin() as conn:  # the scheduler's and the API's reads
            conn.execute(text("SELECT * FROM archive_worker_runs WHERE run_id = :r"), {"r": run.run_id}).one()
        assert time.monotonic() - started < LOCK_BOUND_MS / 1000  # nothing waited for the lock bound
        # The lease passes while the batch is still open: the run is expired on time, not skipped.
        time.sleep(4.5)
        expired = ledger.expire_leases(bounded)
        assert [r.run_id for r in expired] == [run.run_id]
    finally:
        hold.set()
        thread.join(30)
    assert isinstance(outcome["value"], LeaseLost), outcome
    assert _probes(probe, run.run_id) == 0


def test_expiry_skips_a_row_locked_by_a_stuck_session_and_takes_it_next_time(probe, bounded):
    run, _ = _claimed(probe, 60)
    with probe.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 s' WHERE run_id = :r"),
                     {"r": run.run_id})
    stuck = probe.connect()
    try:
        stuck.execute(text("SELECT 1 FROM archive_worker_runs WHERE run_id = :r FOR UPDATE"), {"r": run.run_id})
        started = time.monotonic()
        assert ledger.expire_leases(bounded) == []
        assert time.monotonic() - started < LOCK_BOUND_MS / 1000
    finally:
        stuck.rollback()
        stuck.close()
    assert [r.run_id for r in ledger.expire_leases(bounded)] == [run.run_id]
