"""The standby child (decision 0341): the fork server keeps one child forked ahead, the supervisor hands it
the next run directly, and a new one is forked after each use."""
from __future__ import annotations

import os
import signal

import pytest

from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow


def _standby(runner) -> int:
    return wait_for(lambda: runner.status()["launcher"]["standby"]["pid"], 10, what="a standby child")


def test_the_next_run_goes_to_the_child_forked_ahead_and_another_is_forked(start_runner, engine) -> None:
    runner = start_runner("--poll", "0.2")
    first = _standby(runner)
    run = enqueue(engine, "slow", units=30, pause=0.1)
    assert runner.child_for(run.run_id)["pid"] == first  # the standby took it
    second = _standby(runner)
    assert second != first and pid_alive(second)
    assert wait_status(engine, run.run_id, "SUCCESS").exit_reason is None
    assert runner.status()["launcher"]["standby"]["used"] == 1
    # The standby forked after it was told how children reach the database built its engine ahead.
    second_run = enqueue(engine, "ok")
    done = wait_status(engine, second_run.run_id, "SUCCESS")
    assert done.metrics.get("engine_ahead") is True and done.metrics["child_ready_ms"] >= 0


def test_a_stopped_fork_server_still_starts_one_run_through_its_standby(start_runner, engine) -> None:
    runner = start_runner("--poll", "0.2")
    standby = _standby(runner)
    server = runner.status()["launcher"]["pid"]
    os.kill(server, signal.SIGSTOP)
    try:
        run = enqueue(engine, "slow", units=5, pause=0.05)
        assert runner.child_for(run.run_id, phase=None)["pid"] == standby
    finally:
        os.kill(server, signal.SIGCONT)
    assert wait_status(engine, run.run_id, "SUCCESS").exit_reason is None


def test_a_standby_killed_while_it_waits_costs_no_run(start_runner, engine) -> None:
    runner = start_runner("--poll", "0.2")
    standby = _standby(runner)
    os.kill(standby, signal.SIGKILL)
    wait_for(lambda: not pid_alive(standby), 10, what="the standby to be gone")
    run = enqueue(engine, "ok")
    done = wait_status(engine, run.run_id, ("SUCCESS", "FAILED"))
    assert done.status == "SUCCESS" and done.error is None, done
    assert _standby(runner) != standby
