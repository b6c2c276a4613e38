"""A child whose RunContext.commit finds the lease gone (LeaseLost): the supervisor writes nothing
unless the next heartbeat shows the row is still its own."""
from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from tests.ledger.helpers import register_runner
from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow

FAST = ("--heartbeat", "1", "--lease", "30", "--poll", "0.2")


def _wait_progress(runner, run_id):
    wait_for(lambda: any(c["run_id"] == str(run_id) and (c["progress"] or {}).get("done", 0) >= 2
                         for c in runner.children()), 30, what="a few committed batches")


def test_a_row_taken_by_another_runner_is_left_as_it_is(start_runner, engine):
    runner = start_runner(*FAST)
    run = enqueue(engine, "committer", pause=0.1)
    child = runner.child_for(run.run_id)
    _wait_progress(runner, run.run_id)
    thief = register_runner(engine, ["committer"], name="thief")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET runner_id = :t WHERE run_id = :r"),
                     {"t": thief, "r": run.run_id})
    taken = ledger.get_run(engine, run.run_id)
    wait_for(lambda: not pid_alive(child["pid"]), 30, what="the child to stop on LeaseLost")
    wait_for(lambda: runner.status()["counters"]["lost"] >= 1, 30, what="the supervisor to count it lost")
    after = ledger.get_run(engine, run.run_id)
    assert after.status == "RUNNING" and after.runner_id == thief
    assert after.finished_at is None and after.error is None and after.exit_reason is None
    assert after.progress == taken.progress  # no heartbeat of the old runner touched it either


def test_a_lease_that_passed_while_still_ours_is_closed_interrupted(start_runner, engine):
    runner = start_runner(*FAST)
    run = enqueue(engine, "committer", pause=0.1)
    runner_id = runner.status()["runner_id"]
    child = runner.child_for(run.run_id)
    _wait_progress(runner, run.run_id)
    # Freeze the supervisor (no heartbeat renews the lease meanwhile) and let the lease pass, with
    # nobody expiring the row: the child's next commit is fenced out and it ends with LeaseLost.
    os.kill(runner.pid, signal.SIGSTOP)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 second' "
                              "WHERE run_id = :r"), {"r": run.run_id})
        wait_for(lambda: not pid_alive(child["pid"]), 30, what="the child to stop on LeaseLost")
        assert ledger.get_run(engine, run.run_id).status == "RUNNING"
    finally:
        os.kill(runner.pid, signal.SIGCONT)
    # The next heartbeat shows the row is still this runner's: it is closed, fenced, INTERRUPTED.
    row = wait_status(engine, run.run_id, "INTERRUPTED", timeout=30)
    assert row.exit_reason == "lease-lost" and str(row.runner_id) == runner_id
    assert row.error.startswith("LeaseLost: run ")
