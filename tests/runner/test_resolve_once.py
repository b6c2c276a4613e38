"""Resolve once, at claim, in the supervisor (issue 12): ``record_start`` is written before the child
starts, the child receives the resolved config with its assignment, and a request that does not
resolve ends FAILED ``configuration`` without starting a child."""
from __future__ import annotations

import pytest

from tests.runner.conftest import enqueue, wait_status

pytestmark = pytest.mark.slow


def test_the_supervisor_resolves_and_writes_record_start_before_the_worker_s_first_line(engine, start_runner):
    runner = start_runner("--poll", "0.1", "--heartbeat", "1", "--lease", "8", "--capabilities", "first-look")
    run = wait_status(engine, enqueue(engine, "first-look", flavour="explicit").run_id, ("SUCCESS", "FAILED"))
    assert run.status == "SUCCESS", run.error
    seen = run.result
    # Resolved in the supervisor (not in the child), once: the child got that resolution.
    assert seen["resolved_in_pid"] == runner.pid != seen["child_pid"], seen
    # At the worker's first line the row was RUNNING with what runs (record_start landed before).
    assert seen["status"] == "RUNNING", seen
    assert seen["options"] == {"flavour": "explicit"}, seen
    assert seen["config"]["resolved_in_pid"] == runner.pid and seen["config"]["db_batch_size"] == 1, seen
    assert run.config["resolved_in_pid"] == runner.pid


def test_a_request_that_does_not_resolve_at_claim_fails_configuration_without_a_child(engine, start_runner):
    runner = start_runner("--poll", "0.1", "--heartbeat", "1", "--lease", "8", "--capabilities", "first-look")
    run = wait_status(engine, enqueue(engine, "first-look", refuse=True).run_id, ("FAILED",))
    assert run.exit_reason == "configuration", run
    assert run.error.startswith("InvalidOption: ") and "refused by the resolver at claim" in run.error, run.error
    assert "start_method" not in (run.metrics or {}), run.metrics  # no child was started for it
    assert " -> child " not in runner.log()
    # The slot is free again: the next run of the worker starts.
    ok = wait_status(engine, enqueue(engine, "first-look").run_id, ("SUCCESS", "FAILED"))
    assert ok.status == "SUCCESS", ok.error
