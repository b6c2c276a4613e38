"""Fixtures for the runner's tests: real processes, real signals, the real PostgreSQL of tests/conftest.py.

Every process a test starts carries a marker in its environment (SCRINALIA_TEST_MARK); the finalizer
SIGKILLs every process that carries it (supervisors, fork servers, children and whatever they started),
so a failed test never leaves a process behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from runner import control
from runner.procinfo import is_alive as pid_alive  # noqa: F401 - the tests' name for it
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import WorkerRun

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = "tests.runner.workers:ALL"
RUNNER = [sys.executable, "-m", "runner.cli"]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def marked_pids(mark: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if f"SCRINALIA_TEST_MARK={mark}".encode() in fh.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


class RunnerProcess:
    """A ``scrinalia-runner daemon`` started by a test."""

    def __init__(self, proc: subprocess.Popen, socket_path: Path, log_path: Path, name: str) -> None:
        self.proc = proc
        self.socket_path = socket_path
        self.log_path = log_path
        self.name = name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        return control.query(self.socket_path, {"command": "status"}, timeout=timeout)

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"runner exited {self.proc.returncode}:\n{self.log()}")
            try:
                return self.status(timeout=1.0)
            except (OSError, ValueError):
                return None

        return wait_for(ready, timeout, what=f"runner {self.name} to answer on its control socket")

    def children(self) -> list[dict[str, Any]]:
        return self.status()["children"]

    def child_for(self, run_id: uuid.UUID, timeout: float = 30.0, phase: str | None = "running") -> dict[str, Any]:
        def find():
            for c in self.children():
                if c["run_id"] == str(run_id) and (phase is None or c["phase"] == phase):
                    return c
            return None

        return wait_for(find, timeout, what=f"a {phase or ''} child for run {run_id}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"runner did not exit within {timeout}s:\n{self.log()}") from None


@pytest.fixture
def runner_env(database_url: str) -> Iterator[dict[str, str]]:
    mark = uuid.uuid4().hex
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        SCRINALIA_WORKER_PLUGINS=PLUGINS,
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        SCRINALIA_TEST_MARK=mark,
        PYTHONUNBUFFERED="1",
    )
    env.pop("NOTIFY_SOCKET", None)
    env.pop("RUNNER_DATABASE_URL", None)
    yield env
    for _ in range(3):
        pids = [p for p in marked_pids(mark) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


@pytest.fixture
def start_runner(runner_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., RunnerProcess]]:
    started: list[RunnerProcess] = []

    def start(*flags: str, name: str | None = None, env: dict[str, str] | None = None,
              wait: bool = True, preload: str = "none") -> RunnerProcess:
        name = name or f"r{len(started)}"
        socket_path = tmp_path / f"{name}.sock"
        log_path = tmp_path / f"{name}.log"
        argv = [*RUNNER, "daemon", "--name", name, "--socket", str(socket_path), "--preload", preload, *flags]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env or runner_env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        runner = RunnerProcess(proc, socket_path, log_path, name)
        started.append(runner)
        if wait:
            runner.wait_ready()
        return runner

    yield start
    for runner in started:
        if runner.proc.poll() is None:
            try:
                os.killpg(runner.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            runner.proc.wait()


def wait_status(engine: Engine, run_id: uuid.UUID, statuses: tuple[str, ...] | str, timeout: float = 30.0) -> WorkerRun:
    wanted = (statuses,) if isinstance(statuses, str) else statuses

    def done():
        row = ledger.get_run(engine, run_id)
        return row if row is not None and row.status in wanted else None

    try:
        return wait_for(done, timeout, what=f"run {run_id} to be {'/'.join(wanted)}")
    except AssertionError:
        row = ledger.get_run(engine, run_id)
        raise AssertionError(f"run {run_id} is {row.status if row else None}, not {'/'.join(wanted)}: {row}") from None


def enqueue(engine: Engine, worker: str, **options: Any) -> WorkerRun:
    return ledger.enqueue(engine, worker, {"options": options} if options else {}, requested_by="test")


def dump(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
