"""The supervisor's ports: everything it touches outside its own state, each behind one small interface.

The supervisor (``runner.supervisor``) and its phases never call ``time``, ``select``, ``os.kill`` or
``/proc`` themselves; they receive these collaborators explicitly:

* ``Clock``: CLOCK_MONOTONIC (every deadline of the loop) and the wall clock (only what ``status``
  shows: a wall-clock jump on the host changes no deadline);
* ``Waiter``: the loop's one wait, on its file descriptors with a timeout (``select``);
* ``Processes``: signals to a child (its process group, or the child alone) and what the kernel says of
  it (CPU seconds for the stall rule, RSS, the cgroup's OOM-kill counter);
* ``ControlPort``: the control socket (``runner.control.ControlServer`` is the production one);
* the launcher (``runner.launchers.Launcher``: spawn, exit reports, health) and the ledger
  (``runner.ledger_link.LedgerLink`` over a ledger port: every protocol statement).

The production adapters here are today's code unchanged (``SystemClock``, ``SelectWaiter``,
``SystemProcesses``); the deterministic simulator (``runner.simulation``) gives the same supervisor
virtual ones, so one seed is one reproducible history (decision 0130).
"""
from __future__ import annotations

import errno
import os
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runner import procinfo
from runner import stall as stall_rule


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (CLOCK_MONOTONIC): every deadline of the loop."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch on the host's clock (may jump): shown, never used for a deadline."""
        ...


class Waiter(Protocol):
    def wait(self, fds: Sequence[int], timeout: float) -> None:
        """Return when one of ``fds`` is readable or ``timeout`` seconds passed (whichever first)."""
        ...


class Processes(Protocol):
    def signal_group(self, pid: int, sig: int) -> bool:
        """``sig`` to the child's process group (it and whatever it started). False: already gone."""
        ...

    def signal_one(self, pid: int, sig: int) -> bool:
        """``sig`` to the child alone (SIGUSR1: its stack dump must not kill what it started)."""
        ...

    def cpu_seconds(self, pid: int) -> float | None: ...

    def rss_bytes(self, pid: int) -> int | None: ...

    def oom_kill_counter(self) -> int | None: ...


class ControlPort(Protocol):
    def fileno(self) -> int | None: ...

    def serve_pending(self, handler: Callable[[dict[str, Any]], dict[str, Any]], until: float | None = None) -> None:
        """Answer the clients waiting now, never past ``until`` (the self-fence point)."""
        ...

    def close(self) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class SelectWaiter:
    """``select`` on the loop's descriptors; a signal (EINTR) or a descriptor closed meanwhile (EBADF)
    ends the wait early, which only makes the loop look again."""

    def wait(self, fds: Sequence[int], timeout: float) -> None:
        try:
            select.select(list(fds), [], [], max(0.0, timeout))
        except InterruptedError:
            pass
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise


class SystemProcesses:
    def signal_group(self, pid: int, sig: int) -> bool:
        return procinfo.kill_group(pid, sig)

    def signal_one(self, pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def cpu_seconds(self, pid: int) -> float | None:
        return stall_rule.cpu_seconds(pid)

    def rss_bytes(self, pid: int) -> int | None:
        return procinfo.rss_bytes(pid)

    def oom_kill_counter(self) -> int | None:
        return procinfo.oom_kill_counter()


@dataclass(slots=True)
class Host:
    """The supervisor's ports to the machine it runs on, as one parameter object: the production adapters
    by default, the simulator's virtual ones in a scale-model run."""

    clock: Clock = field(default_factory=SystemClock)
    waiter: Waiter = field(default_factory=SelectWaiter)
    processes: Processes = field(default_factory=SystemProcesses)
    set_title: Callable[[str], None] = procinfo.set_title  # the process title (``ps``)
    install_signals: bool = True  # False: a supervisor inside a test or the simulator leaves the handlers alone
