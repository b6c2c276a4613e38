"""Per-child liveness (issue 9): a child that sends nothing and computes nothing for its stall timeout
has its Python stack dumped, is stopped, and its run ends FAILED ``stalled`` with that stack in ``error``.
A child silent in one long C call (the GIL held), or busy without a word, is alive: it ends SUCCESS,
even past the lease (the supervisor's heartbeat renews it)."""
from __future__ import annotations

import pytest

from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_child_in_one_long_c_call_or_busy_in_silence_is_alive(start_runner, engine):
    runner = start_runner("--heartbeat", "1", "--lease", "3", "--poll", "0.2", "--concurrency", "2",
                          "--stall-timeout", "8")
    c_call = enqueue(engine, "c-call", seconds=5)          # longer than the lease, under the stall timeout
    busy = enqueue(engine, "busy-silent", seconds=24)     # one C call, longer than the stall timeout
    for run in (c_call, busy):
        runner.child_for(run.run_id)
    assert wait_status(engine, c_call.run_id, "SUCCESS", timeout=40).result == {"slept": 5}
    row = wait_status(engine, busy.run_id, "SUCCESS", timeout=90)
    assert row.exit_reason is None
    assert row.duration_ms > 10_000, row.duration_ms  # silent past the stall timeout and its probe window
    assert "dumping its stack" not in runner.log()
    wait_for(lambda: not runner.children(), 10, what="no child left")


def test_the_stall_rule():
    from runner.stall import StallStep, StallWatch, stack_in
    from runner.timings import stall_probe_seconds as probe_seconds

    watch = StallWatch(timeout=8, last_sign=0.0)
    assert watch.due_at() == 8
    assert watch.check(8, cpu_seconds=1.0) is StallStep.WAIT  # silent: take the CPU baseline, probe
    assert watch.due_at() == 8 + probe_seconds(8)
    assert watch.check(10, cpu_seconds=2.5) is StallStep.WAIT  # CPU work in silence: alive, from now
    assert watch.due_at() == 18
    watch.heard(12)  # a message: alive
    assert watch.due_at() == 20
    assert watch.check(20, cpu_seconds=2.5) is StallStep.WAIT
    assert watch.check(22, cpu_seconds=2.51) is StallStep.DUMP_STACK  # no CPU work in the probe window
    assert watch.silent_seconds_at_dump == 10
    watch.heard(22.5)  # a late message does not undo a stall being handled
    due = watch.due_at()
    assert due is not None
    assert watch.check(due, cpu_seconds=2.6) is StallStep.TERMINATE
    assert StallWatch(timeout=0, last_sign=0).due_at() is None  # 0: never
    tail = "noise\nThread 0x00007f (most recent call first):\n  File \"w.py\", line 3 in run_stall\n"
    assert stack_in(tail).startswith("Thread 0x00007f")
