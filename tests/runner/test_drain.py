"""Drain: on SIGTERM, and when the registry row's drain_requested_at is set (the panel's button)."""
from __future__ import annotations

import signal
import uuid

import pytest

from scrinalia.domains.archive import ledger, registry
from tests.runner.conftest import enqueue, wait_for, wait_status

pytestmark = pytest.mark.slow

FAST = ("--heartbeat", "0.5", "--lease", "5", "--poll", "0.2")


def test_sigterm_drains_finishing_what_fits_and_interrupting_the_rest(start_runner, engine):
    runner = start_runner(*FAST, "--concurrency", "2", "--drain-timeout", "4", "--kill-grace", "1")
    runner_id = uuid.UUID(runner.status()["runner_id"])
    quick = enqueue(engine, "slow", units=6, pause=0.25)       # about 1.5 s: inside the deadline
    stuck = enqueue(engine, "hang")                             # never ends by itself
    runner.child_for(quick.run_id)
    runner.child_for(stuck.run_id)
    after = enqueue(engine, "ok")                               # queued: must not be claimed once draining

    runner.proc.send_signal(signal.SIGTERM)
    assert runner.wait_exit(timeout=60) == 0, runner.log()

    assert wait_status(engine, quick.run_id, "SUCCESS").result == {"processed": 6}
    row = wait_status(engine, stuck.run_id, "INTERRUPTED")
    assert row.exit_reason == "runner-stopped" and row.exit_signal == signal.SIGTERM
    assert row.error.startswith("RunnerStopped: the runner was stopped")
    assert ledger.get_run(engine, after.run_id).status == "QUEUED"
    me = registry.get_runner(engine, runner_id)
    assert me.stopped_at is not None and me.state == "stopped"
    assert "draining (SIGTERM received)" in runner.log()


def test_a_drain_requested_in_the_registry_stops_the_runner(start_runner, engine):
    runner = start_runner(*FAST, "--drain-timeout", "10")
    runner_id = uuid.UUID(runner.status()["runner_id"])
    run = enqueue(engine, "slow", units=4, pause=0.25)
    runner.child_for(run.run_id)
    assert registry.request_drain(engine, runner_id, "admin")
    # The log, not the control socket: the runner may have drained and gone before a status query.
    wait_for(lambda: "draining (drain requested in the registry)" in runner.log(), 10,
             what="the runner to start draining")
    assert runner.wait_exit(timeout=60) == 0
    assert wait_status(engine, run.run_id, "SUCCESS")
    assert registry.get_runner(engine, runner_id).stopped_at is not None
    assert "drain requested in the registry" in runner.log()


def test_a_second_sigterm_stops_at_once(start_runner, engine):
    runner = start_runner(*FAST, "--drain-timeout", "300", "--kill-grace", "1")
    run = enqueue(engine, "hang")
    runner.child_for(run.run_id)
    runner.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: runner.status()["draining"], 10, what="draining")
    runner.proc.send_signal(signal.SIGTERM)
    assert runner.wait_exit(timeout=30) == 0
    assert wait_status(engine, run.run_id, "INTERRUPTED").exit_reason == "runner-stopped"
