"""The parent dies (SIGKILL) or freezes (SIGSTOP) while its children run."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import FinishParams
from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow


def test_sigkill_of_the_parent_takes_its_children_and_a_second_runner_repairs_the_rows(start_runner, engine):
    first = start_runner("--concurrency", "2", "--heartbeat", "0.5", "--lease", "3", "--poll", "0.2",
                         "--start-method", "forkserver", name="first")
    runs = [enqueue(engine, "slow", units=500, pause=0.2), enqueue(engine, "hang")]
    children = [first.child_for(r.run_id) for r in runs]
    fork_server = first.status()["launcher"]["pid"]
    runner_id = first.status()["runner_id"]

    os.kill(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not any(pid_alive(c["pid"]) for c in children) and not pid_alive(fork_server),
             timeout=2.0, interval=0.01, what="the children to die with their parent")
    assert time.monotonic() - killed < 2.0
    for r in runs:
        assert ledger.get_run(engine, r.run_id).status == "RUNNING"  # nobody wrote anything yet

    second = start_runner("--heartbeat", "0.5", "--lease", "3", "--poll", "0.2", name="second")
    for r in runs:
        row = wait_status(engine, r.run_id, "INTERRUPTED", timeout=30)
        assert row.exit_reason == "lease-lost" and str(row.runner_id) == runner_id
        assert row.error.startswith("LeaseExpired:")
    nxt = enqueue(engine, "ok", units=3)
    row = wait_status(engine, nxt.run_id, "SUCCESS")
    assert str(row.runner_id) == second.status()["runner_id"]
    assert "lease expired -> INTERRUPTED" in second.log()


def test_sigstop_past_the_lease_then_sigcont_the_old_parent_writes_nothing(start_runner, engine):
    old = start_runner("--heartbeat", "0.5", "--lease", "2", "--poll", "0.2", name="old")
    old_id = uuid.UUID(old.status()["runner_id"])
    run = enqueue(engine, "slow", units=1000, pause=0.1)
    child = old.child_for(run.run_id)

    os.kill(old.pid, signal.SIGSTOP)
    try:
        # The lease passes; another runner (which claims nothing itself) expires the row.
        other = start_runner("--heartbeat", "0.5", "--lease", "2", "--poll", "0.2", "--capabilities", "noop",
                             name="other")
        expired = wait_status(engine, run.run_id, "INTERRUPTED", timeout=30)
        assert expired.exit_reason == "lease-lost"
    finally:
        os.kill(old.pid, signal.SIGCONT)

    # The old parent wakes up, finds the lease lost, kills its child and writes nothing.
    wait_for(lambda: not pid_alive(child["pid"]), timeout=10, what="the old parent to kill its child")
    wait_for(lambda: "lost" in old.log() and old.status()["children"] == [], timeout=10,
             what="the old parent to log the lost run")
    status = old.status()
    assert status["counters"]["lost"] >= 1 and status["counters"]["INTERRUPTED"] == 0
    assert ledger.get_run(engine, run.run_id) == expired
    # Its finish, attempted now, touches 0 rows.
    assert ledger.finish(engine, run.run_id, old_id, FinishParams("FAILED", error="late")) is None
    assert ledger.get_run(engine, run.run_id) == expired
    # And it goes on: renewed registry row, claims again.
    assert registry.get_runner(engine, old_id).state == "online"
    nxt = enqueue(engine, "ok", units=2)
    assert wait_status(engine, nxt.run_id, "SUCCESS").status == "SUCCESS"
    assert other.proc.poll() is None
