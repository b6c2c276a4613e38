"""Per-child liveness (issue 9): a child that sends nothing and computes nothing for its stall timeout
has its Python stack dumped, is stopped, and its run ends FAILED ``stalled`` with that stack in ``error``.
A child silent in one long C call (the GIL held), or busy without a word, is alive: it ends SUCCESS,
even past the lease (the supervisor's heartbeat renews it)."""
from __future__ import annotations

import pytest

from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow


def test_a_stalled_child_ends_failed_stalled_with_its_python_stack(start_runner, engine):
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", "--poll", "0.2", "--concurrency", "2",
                          "--stall-timeout", "2", "--kill-grace", "2")
    stalled = enqueue(engine, "stall")
    unwatched = enqueue(engine, "quiet-unwatched", seconds=6)  # its WorkerSpec says stall_timeout=0
    child = runner.child_for(stalled.run_id)
    row = wait_status(engine, stalled.run_id, "FAILED", timeout=30)
    assert row.exit_reason == "stalled", row
    first, _, rest = row.error.partition("\n")
    assert first.startswith("Stalled: worker stall sent nothing"), row.error
    assert "Python stack" in rest and 'File "' in rest and "run_stall" in rest, row.error
    assert not pid_alive(child["pid"])
    assert "dumping its stack" in runner.log()
    assert wait_status(engine, unwatched.run_id, "SUCCESS", timeout=30)


def test_a_child_in_one_long_c_call_or_busy_in_silence_is_alive(start_runner, engine):
    runner = start_runner("--heartbeat", "1", "--lease", "3", "--poll", "0.2", "--concurrency", "2",
                          "--stall-timeout", "8")
    c_call = enqueue(engine, "c-call", seconds=5)          # longer than the lease, under the stall timeout
    busy = enqueue(engine, "busy-silent", seconds=12)     # longer than the stall timeout, burning CPU
    for run in (c_call, busy):
        runner.child_for(run.run_id)
    assert wait_status(engine, c_call.run_id, "SUCCESS", timeout=40).result == {"slept": 5}
    row = wait_status(engine, busy.run_id, "SUCCESS", timeout=60)
    assert row.exit_reason is None
    assert "dumping its stack" not in runner.log()
    wait_for(lambda: not runner.children(), 10, what="no child left")
