"""A batch transaction left open (a child frozen mid-commit, a whole runner frozen, a batch longer than
the lease) holds nothing that another run, another runner, the one-shot CLI or the scheduler waits on
(issue 9, defects 1 and 2; decision 0100). Real runners, real SIGSTOP/SIGCONT, the real PostgreSQL."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from sqlalchemy import text

from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from scrinalia.scheduler.service import SESSION_BOUNDS, Scheduler
from tests.runner import workers
from tests.runner.conftest import ROOT, RUNNER, enqueue, wait_for, wait_status

pytestmark = pytest.mark.slow

SHORT = ("--heartbeat", "1", "--lease", "4", "--poll", "0.2")


@pytest.fixture
def units(engine):
    with engine.begin() as conn:
        conn.execute(text(workers.STAMPER_TABLE_SQL))

    def add(worker: str, n: int) -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO fence_units (worker) SELECT :w FROM generate_series(1, :n)"),
                         {"w": worker, "n": n})
    return add


def _stamped(engine, run_id: uuid.UUID) -> dict[int, int]:
    """batch -> units stamped by ``run_id`` (what landed)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT done_batch, count(*) AS n FROM fence_units WHERE done_by = :r "
                                 "GROUP BY done_batch"), {"r": run_id}).all()
    return {r.done_batch: r.n for r in rows}


def _stop_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except ProcessLookupError:
        pass


def _claimed_within(engine, runner, worker: str, limit: float) -> float:
    run = enqueue(engine, worker)
    row = wait_status(engine, run.run_id, ("SUCCESS",), timeout=30)
    latency = (row.started_at - row.queued_at).total_seconds()
    assert latency < limit, f"{worker} claimed {latency:.1f}s after its enqueue (limit {limit}s)"
    return latency


def test_a_frozen_batch_stalls_nobody_and_is_refused_when_it_resumes(start_runner, engine, units, runner_env,
                                                                      database_url, tmp_path):
    units("stamper-a", 40)
    frozen = start_runner(*SHORT, "--capabilities", "stamper-a,slow-b", "--concurrency", "2", name="frozen")
    release = tmp_path / "release"
    run = ledger.enqueue(engine, "stamper-a", {"options": {"hold_at": 2, "until": str(release), "pause": 0.05}},
                         requested_by="test")
    sibling = enqueue(engine, "slow-b", units=15, pause=0.2)
    wait_for(lambda: "in-commit 2" in frozen.log(), 30, what="the batch to be open")
    child = frozen.child_for(run.run_id, phase=None)
    _stop_group(child["pid"], signal.SIGSTOP)  # the child is frozen mid-commit, its transaction open
    try:
        healthy = start_runner(*SHORT, "--capabilities", "ok,noop", name="healthy")
        # The healthy runner claims within its poll interval (generous: a loaded machine).
        for _ in range(3):
            _claimed_within(engine, healthy, "ok", limit=5.0)
        # An unrelated one-shot run succeeds.
        oneshot = subprocess.run([*RUNNER, "run", "noop", "--lease", "4", "--heartbeat", "1"], cwd=ROOT,
                                 env=runner_env, capture_output=True, text=True, timeout=60)
        assert oneshot.returncode == 0, oneshot.stderr
        # The scheduler ticks, under its own bounds.
        sched_engine = create_engine_from_url(database_url, connect_args=dict(SESSION_BOUNDS))
        try:
            started = time.monotonic()
            assert Scheduler(sched_engine, {}).tick().leader
            assert time.monotonic() - started < 5
        finally:
            sched_engine.dispose()
        # The frozen child's own runner still renews its leases: its sibling ends SUCCESS.
        assert wait_status(engine, sibling.run_id, ("SUCCESS", "FAILED", "INTERRUPTED"), timeout=60).status == "SUCCESS"
        assert frozen.status()["database"]["state"] == "ok"
        assert ledger.get_run(engine, run.run_id).status == "RUNNING"

        # Now the whole runner freezes: nobody renews the lease, the healthy runner expires it on time.
        _stop_group(frozen.pid, signal.SIGSTOP)
        lease_end = ledger.get_run(engine, run.run_id).lease_expires_at
        row = wait_status(engine, run.run_id, ("INTERRUPTED",), timeout=30)
        late = (row.finished_at - lease_end).total_seconds()
        assert row.exit_reason == "lease-lost"
        assert late < 3.0, f"expired {late:.1f}s after its lease end"
        _claimed_within(engine, healthy, "ok", limit=5.0)

        # The frozen child resumes (its runner still stopped): its batch is refused, nothing lands.
        release.touch()
        _stop_group(child["pid"], signal.SIGCONT)
        wait_for(lambda: not _child_running(child["pid"]), 30, what="the resumed child to stop")
        assert 2 not in _stamped(engine, run.run_id)
    finally:
        release.touch()
        _stop_group(child["pid"], signal.SIGCONT)
        _stop_group(frozen.pid, signal.SIGCONT)
    wait_for(lambda: frozen.status()["children"] == [], 30, what="the frozen runner to drop its child")
    assert set(_stamped(engine, run.run_id)) <= {1}
    assert ledger.get_run(engine, run.run_id).status == "INTERRUPTED"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE status = 'RUNNING'")).scalar_one() == 0


def _child_running(pid: int) -> bool:
    """Alive and not stopped; a zombie (its parent is frozen) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "T")


def test_a_sibling_of_a_batch_longer_than_the_lease_ends_success(start_runner, engine, units):
    units("stamper-b", 10)
    runner = start_runner(*SHORT, "--capabilities", "stamper-b,slow-b", "--concurrency", "2")
    long = ledger.enqueue(engine, "stamper-b", {"options": {"hold_at": 1, "hold": 6}}, requested_by="test")
    wait_for(lambda: "in-commit 1" in runner.log(), 30, what="the long batch to be open")
    sibling = enqueue(engine, "slow-b", units=30, pause=0.2)
    assert wait_status(engine, sibling.run_id, ("SUCCESS", "FAILED", "INTERRUPTED"), timeout=60).status == "SUCCESS"
    done = wait_status(engine, long.run_id, ("SUCCESS", "FAILED", "INTERRUPTED"), timeout=60)
    assert done.status != "RUNNING"
    assert runner.status()["state"] == "running"
