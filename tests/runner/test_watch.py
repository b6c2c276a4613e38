"""``scrinalia-runner status --watch`` driven in a real tmux (its own server), against a real daemon running
a real slow worker: the view shows the running child, its progress moves from one redraw to the next,
and ``q`` quits with the terminal given back."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from scrinalia.domains.archive.run_ids import short_id
from tests.runner.conftest import ROOT, RUNNER, enqueue, wait_for, wait_status

pytestmark = pytest.mark.slow


class Tmux:
    """A tmux server of the test's own (``-L``), so it never touches an operator's sessions."""

    def __init__(self) -> None:
        self.socket = f"scrinalia-watch-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                              timeout=20)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "watch").stdout

    def alive(self) -> bool:
        return self("has-session", "-t", "watch").returncode == 0

    def kill(self) -> None:
        """Stop the server and remove its socket file (tmux leaves it behind)."""
        self("kill-server")
        tmpdir = os.environ.get("TMUX_TMPDIR") or "/tmp"
        (Path(tmpdir) / f"tmux-{os.getuid()}" / self.socket).unlink(missing_ok=True)


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    t = Tmux()
    yield t
    t.kill()


def _row(screen: str, run_id: str) -> str | None:
    """The run's row: its whole id on a wide terminal, its short id (run_ids.short_id) on an 80-column one."""
    short = short_id(run_id)
    return next((line for line in screen.splitlines() if run_id in line or f" {short} " in line), None)


def _done(screen: str, run_id: str) -> int | None:
    """The done count of the run's row on the screen (``N/400``)."""
    row = _row(screen, run_id)
    m = re.search(r"\b(\d+)/400\b", row) if row else None
    return int(m.group(1)) if m else None


def test_watch_in_tmux_shows_the_running_child_updates_its_progress_and_quits_on_q(
        start_runner, runner_env, engine, tmux, tmp_path):
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", "--poll", "0.2")
    run = enqueue(engine, "slow", units=400, pause=0.1)
    runner.child_for(run.run_id)
    exit_file = tmp_path / "exit"
    command = " ".join(shlex.quote(a) for a in [*RUNNER, "status", "--watch", "--socket", str(runner.socket_path)])
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in runner_env.items() if k in ("PYTHONPATH", "PATH", "HOME"))
    # An 80 x 24 terminal, as a plain SSH session has (tmux's default for a detached session).
    # No COLUMNS / LINES from the test's environment: the view follows the terminal's own size.
    stderr = shlex.quote(str(tmp_path / "stderr"))
    started = tmux("new-session", "-d", "-s", "watch", "-x", "80", "-y", "24", "-c", str(ROOT),
                   f"env -u COLUMNS -u LINES TERM=xterm-256color {env} {command} 2>{stderr}; "
                   f"echo \"exit=$?\" > {shlex.quote(str(exit_file))}")
    assert started.returncode == 0, started.stderr

    run_id = str(run.run_id)
    def shown():
        screen = tmux.screen()
        return screen if _done(screen, run_id) else None

    try:
        first = wait_for(shown, 30, 0.2, what="the running child on the screen")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{tmux.screen()}") from None
    assert "scrinalia-runner status --watch" in first and "q quits" in first
    assert f"runner {runner.name}" in first and "database ok" in first and "lease margin" in first
    assert all(len(line) <= 80 for line in first.splitlines())
    header = next(line for line in first.splitlines() if "WORKER" in line)
    for column in ("RUN", "ELAPSED", "PROGRESS", "RATE", "ETA", "RSS", "GPU", "LEASE"):
        assert column in header, header
    row = _row(first, run_id)
    assert row is not None and row.split()[0] == "slow" and "MiB" in row, row

    # The view redraws itself every second: the progress moves, a rate and an ETA appear.
    def moved():
        screen = tmux.screen()
        more = (_done(screen, run_id) or 0) > (_done(first, run_id) or 0)
        return screen if more and re.search(r"\d+\.\d/s", screen) else None

    later = wait_for(moved, 20, 0.2, what="the progress moving on the screen")
    row = _row(later, run_id)
    assert row is not None and re.search(r"\d+\.\d/s", row), row

    # A wider terminal (the window resized, as tmux does when a wider client attaches): the whole run
    # id, the pid and the phase.
    assert tmux("resize-window", "-t", "watch", "-x", "200", "-y", "40").returncode == 0

    def wide():
        screen = tmux.screen()
        return screen if run_id in screen and "PHASE" in screen else None

    try:
        wide_screen = wait_for(wide, 10, 0.2, what="the wide layout")
    except AssertionError as exc:
        ended = exit_file.read_text() if exit_file.exists() else "still running"
        ended += (tmp_path / "stderr").read_text() if (tmp_path / "stderr").exists() else ""
        raise AssertionError(f"{exc}; the screen:\n{tmux.screen()}\n{ended}") from None
    row = _row(wide_screen, run_id)
    assert row is not None and "running" in row and re.search(r"\b\d{3,7}\b", row), row

    assert tmux("send-keys", "-t", "watch", "q").returncode == 0
    wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), 10, what="the view to quit on q")
    assert exit_file.read_text().strip() == "exit=0"
    # The runner goes on: the view only reads.
    assert wait_status(engine, run.run_id, ("RUNNING", "SUCCESS")).status in ("RUNNING", "SUCCESS")
    deadline = time.monotonic() + 10
    while tmux.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tmux.alive(), "the tmux session outlived the view"


def test_watch_all_reads_every_live_runner_from_the_registry(start_runner, runner_env, engine, tmux, tmp_path):
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", "--poll", "0.2")
    run = enqueue(engine, "slow", units=400, pause=0.1)
    runner.child_for(run.run_id)
    exit_file = tmp_path / "exit"
    command = " ".join(shlex.quote(a) for a in [*RUNNER, "status", "--watch", "--all"])
    keep = ("PYTHONPATH", "PATH", "HOME", "DATABASE_URL")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in runner_env.items() if k in keep)
    started = tmux("new-session", "-d", "-s", "watch", "-x", "200", "-y", "40", "-c", str(ROOT),
                   f"env -u COLUMNS -u LINES TERM=xterm-256color {env} {command} 2>/dev/null; "
                   f"echo \"exit=$?\" > {shlex.quote(str(exit_file))}")
    assert started.returncode == 0, started.stderr
    tmux("resize-window", "-t", "watch", "-x", "200", "-y", "40")
    run_id = str(run.run_id)

    def shown():
        screen = tmux.screen()
        return screen if (_done(screen, run_id) or 0) > 0 else None

    try:
        screen = wait_for(shown, 30, 0.2, what="the registry's runner and its run on the screen")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{tmux.screen()}") from None
    assert "every live runner (registry)" in screen and f"runner {runner.name}" in screen
    assert "registry: online" in screen
    row = _row(screen, run_id)
    assert row is not None and row.split()[0] == "slow", row
    assert tmux("send-keys", "-t", "watch", "q").returncode == 0
    wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), 10, what="the view to quit on q")
    assert exit_file.read_text().strip() == "exit=0"


def test_the_progress_unit_agrees_with_its_number():
    """Issue 28, 7: "112/200 documents", "1 document", not "112/200 document"."""
    from runner.watch import ChildView, _progress

    def child(done: float, total: float | None) -> ChildView:
        return ChildView(run_id="r", worker="w", pid=1, phase="running", elapsed_s=1.0, done=done, total=total,
                         unit="document", rss_bytes=None, gpu_bytes=None, lease_s=None)

    assert _progress(child(112, 200)) == "112/200 documents (56%)"
    assert _progress(child(1, None)) == "1 document"
    assert _progress(child(0, None)) == "0 documents"
    assert _progress(child(112, 200), with_unit=False) == "112/200 (56%)"
