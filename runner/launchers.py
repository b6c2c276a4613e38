"""How the supervisor starts children: the common interface, exit reports, and plain spawn.

A launcher starts one child for a pair of file descriptors (the child's end of its socket to the
supervisor, and the write end of its output pipe) and later reports how each child exited:
``ChildExit`` carries the wait status and the kernel's resource usage (peak RSS, CPU seconds).

* ``SpawnLauncher`` (here): a fresh ``python -m runner.child`` per run. The supervisor is the real
  parent; a pidfd per child makes its exit wake the supervisor's ``select`` without SIGCHLD.
* ``ForkServerLauncher`` (``runner.forkserver``): children forked from a preloaded fork server, which
  reaps them and reports their exits over its socket.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ChildExit:
    pid: int
    exit_code: int | None   # set when the child exited
    signal: int | None      # set when a signal killed it
    peak_rss_bytes: int | None
    cpu_seconds: float | None

    @classmethod
    def from_wait(cls, pid: int, status: int, rusage) -> ChildExit:
        code = sig = None
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
        else:
            code = os.waitstatus_to_exitcode(status)
        return cls(
            pid=pid,
            exit_code=code,
            signal=sig,
            peak_rss_bytes=rusage.ru_maxrss * 1024 if rusage is not None else None,
            cpu_seconds=round(rusage.ru_utime + rusage.ru_stime, 3) if rusage is not None else None,
        )

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}"
        return f"exited with code {self.exit_code}"


class LauncherNotReady(Exception):
    """The launcher did not start the child (a stopped, dead or restarting fork server): no worker code
    ran, so the run is not failed; the supervisor spawns it again when the launcher answers (decision 0136)."""


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class Launcher(Protocol):
    name: str
    child_preload: tuple[str, ...]  # what a child imports itself before it runs (the assignment's "preload")
    warm_info: dict[str, Any]  # the warm models the launcher holds, as the heartbeat reports them (decision 0381)

    def start(self, wait: bool = True) -> None: ...

    @property
    def stalled(self) -> bool:
        """A spawn request is unanswered (a stopped fork server): the supervisor claims nothing meanwhile."""
        ...

    def spawn(self, channel_fd: int, output_fd: int, timeout: float | None = None) -> int:
        """The child's pid. Raises ``LauncherNotReady`` when no child was started for the request."""
        ...

    def wait_fds(self) -> list[int]: ...

    def collect_exits(self) -> list[ChildExit]: ...

    def healthy(self) -> bool: ...

    def info(self) -> dict: ...

    def close(self) -> None: ...

    def warm(self, key: dict[str, str], worker: str) -> bool:
        """Keep the model ``key`` warm for ``worker`` (a child loaded it cold); True when asked (decision 0340)."""
        ...

    def set_prepare(self, prepare: dict[str, Any]) -> None:
        """How children reach the database: a standby child builds its engine ahead (decision 0341)."""
        ...


class SpawnLauncher:
    """A fresh interpreter per child: nothing inherited, nothing preloaded (seconds with torch)."""

    name = "spawn"
    stalled = False  # fork + exec: no server to wait on

    def __init__(self, preload: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.preload = preload
        self.child_preload = preload  # a spawned child imports these itself (what a real worker would)
        self.env = env
        self.warm_info: dict[str, Any] = {}  # a fresh interpreter per child: nothing is kept warm
        self._children: dict[int, tuple[subprocess.Popen, int | None]] = {}

    def start(self, wait: bool = True) -> None:
        pass

    def spawn(self, channel_fd: int, output_fd: int, timeout: float | None = None) -> int:
        argv = [sys.executable, "-m", "runner.child", "--channel-fd", str(channel_fd), "--parent-pid", str(os.getpid())]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            pass_fds=(channel_fd,),
            close_fds=True,
            start_new_session=True,
            env=self.env,
        )
        try:
            pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = None  # old kernel: the supervisor's loop polls (its timeout is short while children live)
        self._children[proc.pid] = (proc, pidfd)
        return proc.pid

    def wait_fds(self) -> list[int]:
        return [fd for _, fd in self._children.values() if fd is not None]

    def collect_exits(self) -> list[ChildExit]:
        exits = []
        for pid, (proc, pidfd) in list(self._children.items()):
            try:
                got, status, rusage = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                got, status, rusage = pid, 0, None
            if got == 0:
                continue
            proc.returncode = os.waitstatus_to_exitcode(status)
            if pidfd is not None:
                os.close(pidfd)
            del self._children[pid]
            exits.append(ChildExit.from_wait(pid, status, rusage))
        return exits

    def healthy(self) -> bool:
        return True

    def info(self) -> dict:
        return {"start_method": "spawn", "preload": list(self.preload)}

    def warm(self, key: dict[str, str], worker: str) -> bool:
        return False  # a fresh interpreter per child: nothing is kept warm

    def set_prepare(self, prepare: dict[str, Any]) -> None:
        pass  # no standby child

    def close(self) -> None:
        for pid, (proc, pidfd) in list(self._children.items()):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if pidfd is not None:
                os.close(pidfd)
        self._children.clear()
