"""Cancellation (cooperative, then forced after the grace) and --max-runtime."""
from __future__ import annotations

import signal

import pytest

from scrinalia.domains.archive import ledger
from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow

FAST = ("--heartbeat", "0.3", "--lease", "5", "--poll", "0.2")


def test_a_cancel_request_ends_the_run_cancelled_at_a_batch_boundary_with_its_partial_result(start_runner, engine):
    runner = start_runner(*FAST)
    run = enqueue(engine, "slow", units=1000, pause=0.05)
    runner.child_for(run.run_id)
    wait_for(lambda: any((c["progress"] or {}).get("done", 0) >= 5 for c in runner.children()), 20,
             what="a few batches")
    ledger.request_cancel(engine, run.run_id, "alice")
    row = wait_status(engine, run.run_id, "CANCELLED")
    assert row.exit_reason == "cancelled" and row.exit_code == 0
    assert row.cancel_requested_by == "alice"
    assert 5 <= row.result["processed"] < 1000
    assert row.result["processed"] == row.progress["done"]
    assert row.result["cancelled"].startswith("cancelled after")
    assert row.error is None


def test_a_worker_that_ignores_the_cancel_is_stopped_after_the_grace(start_runner, engine):
    runner = start_runner(*FAST, "--cancel-grace", "1", "--kill-grace", "1")
    run = enqueue(engine, "stubborn")  # never reaches a batch boundary, and ignores SIGTERM
    child = runner.child_for(run.run_id)
    ledger.request_cancel(engine, run.run_id, "bob")
    row = wait_status(engine, run.run_id, "CANCELLED", timeout=30)
    assert row.exit_reason == "cancel-forced"
    assert row.exit_signal == signal.SIGKILL  # SIGTERM was ignored, SIGKILL followed
    assert row.error.startswith("CancelForced: the worker did not stop within 1 s")
    assert not pid_alive(child["pid"])


def test_max_runtime_kills_the_child_and_fails_the_run_with_timeout(start_runner, engine):
    runner = start_runner(*FAST, "--max-runtime", "1.5", "--concurrency", "2")
    run = enqueue(engine, "hang")
    quick = enqueue(engine, "ok", units=3)
    row = wait_status(engine, run.run_id, "FAILED", timeout=30)
    assert row.exit_reason == "timeout" and row.exit_signal == signal.SIGKILL
    assert row.error.startswith("Timeout: the run exceeded --max-runtime of 1.5 s")
    assert "hanging" in row.error  # the child's output tail
    assert wait_status(engine, quick.run_id, "SUCCESS")
    assert runner.proc.poll() is None
