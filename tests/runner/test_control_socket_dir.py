"""The control socket's directory is the operator's (issue 10, defect 7; docs/security.md).

A real daemon with ``--socket`` in a 1777 and in a 0755 directory leaves both modes as they were; a
directory it has to create is 0700 and gone again at exit; a directory others may write to without the
sticky bit is refused (exit 2, one clear line).
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from runner import control
from runner.options import EXIT_USAGE
from tests.runner.conftest import ROOT, RUNNER, wait_for


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _daemon(runner_env, socket_path: Path, log: Path) -> subprocess.Popen:
    argv = [*RUNNER, "daemon", "--name", socket_path.stem, "--socket", str(socket_path), "--preload", "none",
            "--capabilities", "ok", "--poll", "0.2"]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=runner_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _answers(proc: subprocess.Popen, socket_path: Path, log: Path):
    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"runner exited {proc.returncode}:\n{log.read_text()}")
        try:
            return control.query(socket_path, {"command": "status"}, timeout=1.0)
        except (OSError, ValueError):
            return None

    return wait_for(ready, 60, what="the runner to answer on its control socket")


def _stop(proc: subprocess.Popen, log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()


@pytest.mark.parametrize("mode", [0o1777, 0o755])
def test_an_existing_directory_keeps_its_mode(runner_env, tmp_path, mode):
    directory = tmp_path / f"sockets-{mode:o}"
    directory.mkdir()
    os.chmod(directory, mode)
    socket_path, log = directory / "r.sock", tmp_path / "r.log"
    proc = _daemon(runner_env, socket_path, log)
    try:
        _answers(proc, socket_path, log)
        assert _mode(directory) == mode
        assert _mode(socket_path) == 0o600
        _stop(proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _mode(directory) == mode and directory.is_dir() and not socket_path.exists()


def test_a_missing_directory_is_created_0700_and_removed_at_exit(runner_env, tmp_path):
    directory = tmp_path / "run" / "scrinalia-runner"
    socket_path, log = directory / "r.sock", tmp_path / "r.log"
    proc = _daemon(runner_env, socket_path, log)
    try:
        _answers(proc, socket_path, log)
        assert _mode(directory) == 0o700
        _stop(proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not directory.exists() and (tmp_path / "run").is_dir()


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_directory_others_may_write_without_the_sticky_bit_is_refused(runner_env, tmp_path, mode):
    directory = tmp_path / "open"
    directory.mkdir()
    os.chmod(directory, mode)
    socket_path, log = directory / "r.sock", tmp_path / "r.log"
    proc = _daemon(runner_env, socket_path, log)
    assert proc.wait(timeout=60) == EXIT_USAGE, log.read_text()
    text = log.read_text()
    assert "no sticky bit" in text and "Traceback" not in text
    assert _mode(directory) == mode and not socket_path.exists()


def test_a_file_that_is_not_a_socket_is_never_removed(runner_env, tmp_path):
    victim = tmp_path / "important.sock"
    victim.write_text("keep me")
    log = tmp_path / "r.log"
    proc = _daemon(runner_env, victim, log)
    assert proc.wait(timeout=60) == EXIT_USAGE, log.read_text()
    assert victim.read_text() == "keep me"
