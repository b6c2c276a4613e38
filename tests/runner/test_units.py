"""Unit tests of the runner's pure parts: framing, options, outcomes, the import guard, /proc readers."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Any, cast

import pytest

from runner import wire
from runner.launchers import ChildExit
from runner.options import OptionsError, RunnerOptions, default_socket_path, parse_list
from runner.outcome import ERROR_MAX, decide, with_tail
from runner.procinfo import oom_kill_counter, peak_rss_bytes, rss_bytes

NOTHING: Any = None  # what a unit test of the loop passes where it needs no database or run


def test_frames_survive_being_split_and_batched():
    a, b = socket.socketpair()
    b.setblocking(False)
    reader = wire.FrameReader(b)
    data = wire.encode("progress", {"done": 1}) + wire.encode("result", {"status": "SUCCESS", "x": "y" * 100_000})
    a.sendall(data[:7])
    assert reader.read() == []
    a.sendall(data[7:])
    got: list = []
    while len(got) < 2:
        got += reader.read()
    assert got == [("progress", {"done": 1}), ("result", {"status": "SUCCESS", "x": "y" * 100_000})]
    a.close()
    assert reader.read() == [] and reader.eof


def test_options_refuse_a_lease_not_above_the_heartbeat_and_compute_the_fence_margin():
    with pytest.raises(OptionsError, match="must exceed --heartbeat"):
        RunnerOptions(name="x", heartbeat_seconds=15, lease_seconds=15).validate()
    assert RunnerOptions(name="x").validate().fence_margin == 7.5  # min(15, 45) / 2
    assert RunnerOptions(name="x", heartbeat_seconds=1, lease_seconds=1.5).fence_margin == 0.25
    assert parse_list("torch, transformers,,") == ("torch", "transformers")
    assert parse_list("none") == ()
    assert default_socket_path("gpu/1 a").name == "gpu_1_a.sock"


def _decide(**kw):
    base: dict[str, Any] = dict(
                worker="w", exit=ChildExit(1, None, signal.SIGKILL, 1, 0.1), result=None, kill_reason=None,
                signals_sent=set(), stderr_tail="", oom_kills_before=0, oom_kills_after=0, max_runtime=None,
                cancel_grace=60, drain_timeout=120)
    base.update(kw)
    return decide(**base)


def test_an_unexpected_sigkill_is_an_oom_kill_when_the_cgroup_counter_moved():
    confirmed = _decide(oom_kills_before=2, oom_kills_after=3)
    assert confirmed.exit_reason == "oom" and confirmed.error.startswith("OutOfMemory:")
    possible = _decide()
    assert possible.exit_reason == "signal" and possible.error.startswith("PossibleOOMKill:")
    unreadable = _decide(oom_kills_before=None, oom_kills_after=None)
    assert "cannot be read here" in unreadable.error
    ours = _decide(signals_sent={signal.SIGKILL}, kill_reason="timeout", max_runtime=5)
    assert ours.exit_reason == "timeout"


def test_a_result_wins_over_how_the_child_ended():
    out = _decide(result={"status": "SUCCESS", "result": {"n": 1}}, kill_reason="runner-stopped")
    assert out.status == "SUCCESS" and out.result == {"n": 1}
    lost = _decide(result={"status": None, "lease_lost": True, "error": "LeaseLost: x"})
    assert lost.write is False


def test_errors_keep_their_first_line_and_fit_the_ledger():
    text = with_tail("ChildCrashed: worker w was killed by SIGSEGV", "line\n" * 5000)
    assert len(text) <= ERROR_MAX and text.splitlines()[0] == "ChildCrashed: worker w was killed by SIGSEGV"


def test_the_import_guard_refuses_torch_in_a_supervisor():
    code = ("from runner.guard import forbid_heavy_imports; forbid_heavy_imports()\n"
            "try:\n    import torch\nexcept ImportError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused: the runner's supervisor must never import 'torch'" in out.stdout


def test_proc_readers():
    assert rss_bytes(os.getpid()) > 0 and peak_rss_bytes(os.getpid()) >= rss_bytes(os.getpid()) // 2
    assert rss_bytes(2 ** 22 + 7) is None
    assert oom_kill_counter() is None or oom_kill_counter() >= 0


def test_the_progress_bar_draws_on_a_tty_only():
    import io

    from runner.oneshot import ProgressBar

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = ProgressBar(stream=tty, width=10)
    bar.update({"done": 5, "total": 10, "unit": "document"})
    bar.close()
    assert "[#####-----] 5/10 document  50.0%" in tty.getvalue() and tty.getvalue().endswith("\n")
    plain = io.StringIO()
    quiet = ProgressBar(stream=plain)
    quiet.update({"done": 1, "total": 2})
    quiet.close()
    assert plain.getvalue() == ""


def _idle_supervisor(**options):
    """A supervisor that has opened nothing: only its deadline table is exercised."""
    import time
    import uuid
    from types import SimpleNamespace

    from runner.launchers import SpawnLauncher
    from runner.loop_state import ChildSetup
    from runner.ports import Host
    from runner.supervisor import Supervisor

    sup = Supervisor(RunnerOptions(name="x", **options).validate(),
                     cast(Any, SimpleNamespace(runner_id=uuid.uuid4(), capabilities=(), name="x")), SpawnLauncher(),
                     ChildSetup("", {}, engine=NOTHING), host=Host(install_signals=False))
    sup.heartbeat.next_at = sup.poll.next_at = time.monotonic() + 3600
    return sup


def test_a_child_s_phase_follows_what_it_said_and_what_it_was_sent():
    import time

    from runner.supervisor import Child

    a, b = socket.socketpair()
    child = Child(run=NOTHING, pid=1, channel=a, output_fd=None, claimed_at=time.monotonic())
    assert child.phase == "starting" and child.reader.sock is a
    child.state.started(time.monotonic())
    assert child.phase == "running"
    child.state.reported({"status": "SUCCESS"}, time.monotonic())
    assert child.phase == "finishing"
    child.state.stop(signal.SIGKILL, None, time.monotonic())
    assert child.phase == "stopping"
    a.close()
    b.close()


def test_a_deadline_that_calls_for_nothing_does_not_wake_the_loop():
    """A finishing child past --max-runtime, a cancelled one past its grace, a drain past its deadline:
    nothing is due for them until the kill grace, so the loop sleeps instead of spinning."""
    import time

    from runner.supervisor import Child
    from runner.timings import MAX_SELECT_WAIT

    sup = _idle_supervisor(max_runtime=1, cancel_grace=1, kill_grace=30, drain_timeout=0)
    a, b = socket.socketpair()
    now = time.monotonic()
    child = Child(run=NOTHING, pid=1, channel=a, output_fd=None, claimed_at=now - 60)
    child.state.request_cancel(now - 60)
    child.state.reported({"status": "SUCCESS"}, now)
    sup.children[child.pid] = child
    sup.drain.draining, sup.drain.deadline = True, now - 60
    assert [at for at, _ in sup.deadlines.of(child)] == [now + 30]
    assert sup.timeout() > MAX_SELECT_WAIT / 2
    child.state.result = child.state.result_at = None  # still working: every one of those is due now
    assert len(sup.deadlines.of(child)) == 3 and sup.timeout() == 0
    child.state.lose(now)  # SIGKILLed already: only its exit is awaited
    assert sup.deadlines.of(child) == [] and sup.timeout() > MAX_SELECT_WAIT / 2
    a.close()
    b.close()
