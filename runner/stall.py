"""Per-child liveness: a child that neither talks nor computes for its stall timeout is stalled.

The signs of life of a running child are its messages to the supervisor (progress, result) and its
CPU time (``/proc/PID/stat``): a child that sits in one long C call burning CPU (a big matrix product
that holds the GIL) sends nothing, yet it is alive. A child that does neither for ``timeout`` seconds
(a deadlock, a read that never returns, a GPU wait that never ends) is *stalled*: the supervisor asks
it for its Python stack (SIGUSR1: the child's ``faulthandler`` writes every thread's stack to its
stderr, which the supervisor keeps as the output tail), then stops it (SIGTERM, then SIGKILL after the
kill grace), and the run ends FAILED with ``exit_reason`` ``stalled`` and that stack in ``error``
(decision 0111).

The CPU baseline is taken lazily, when the silence first reaches the timeout: no ``/proc`` read per
message. A child found silent then is given a short probe window (``timings.stall_probe_seconds``) to show CPU work
before the stack dump; so a stall is declared between ``timeout`` and ``timeout + probe_seconds`` after
the last sign of life. The timeout fits a slow GPU batch (``DEFAULT_STALL_TIMEOUT``, 10 min); a worker
declares its own with ``WorkerSpec.stall_timeout`` (0: never), which the child reports when it starts.

Pure state and decisions here (``StallWatch``); the supervisor puts ``due_at`` in its deadline list and
calls ``check`` when it falls due.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import Enum

from runner.timings import STALL_DUMP_GRACE, stall_probe_seconds

CPU_ALIVE_SECONDS = 0.05  # CPU seconds that count as work within one probe window


class StallStep(Enum):
    WAIT = "wait"            # nothing to do now (the next ``due_at`` moved forward)
    DUMP_STACK = "dump"      # send SIGUSR1: the child writes its threads' stacks to stderr
    TERMINATE = "terminate"  # send SIGTERM (then SIGKILL after the kill grace): FAILED stalled




@dataclass(slots=True)
class StallWatch:
    """One running child's liveness. ``timeout`` <= 0: never stalled."""

    timeout: float
    last_sign: float                  # CLOCK_MONOTONIC of the last message (or of CPU work seen)
    cpu_at: float | None = None       # the child's CPU seconds at ``cpu_since`` (the probe's baseline)
    cpu_since: float | None = None
    dumped_at: float | None = None    # the stack dump was asked for

    def heard(self, now: float) -> None:
        """A message from the child: alive. A stall already being handled is not undone."""
        if self.dumped_at is None:
            self.last_sign = now
            self.cpu_at = self.cpu_since = None

    def due_at(self) -> float | None:
        """When ``check`` must next be called; None: never."""
        if self.timeout <= 0:
            return None
        if self.dumped_at is not None:
            return self.dumped_at + STALL_DUMP_GRACE
        if self.cpu_since is not None:
            return self.cpu_since + stall_probe_seconds(self.timeout)
        return self.last_sign + self.timeout

    def check(self, now: float, cpu_seconds: float | None) -> StallStep:
        """Decide at ``due_at``: probe the CPU, dump the stack, or stop the child."""
        if self.dumped_at is not None:
            return StallStep.TERMINATE
        if self.cpu_since is None:
            if cpu_seconds is None:  # /proc unreadable (the child is exiting): no CPU evidence
                return self._dump(now)
            self.cpu_at, self.cpu_since = cpu_seconds, now
            return StallStep.WAIT
        if cpu_seconds is not None and self.cpu_at is not None and cpu_seconds - self.cpu_at >= CPU_ALIVE_SECONDS:
            # Working in silence (one long C call): alive; the timeout starts again from here.
            self.last_sign = now
            self.cpu_at = self.cpu_since = None
            return StallStep.WAIT
        return self._dump(now)

    def _dump(self, now: float) -> StallStep:
        self.dumped_at = now
        return StallStep.DUMP_STACK

    @property
    def silent_seconds_at_dump(self) -> float | None:
        return None if self.dumped_at is None else self.dumped_at - self.last_sign


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads) and of its reaped children; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime (fields 14-17)
    except (IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


def _stack_line(line: str) -> bool:
    return bool(_HEADER.match(line)) or line.startswith("  ") or not line.strip()


def stack_in(tail: str) -> str:
    """The last faulthandler dump in ``tail`` (from its first thread's header on), else the whole tail."""
    lines = tail.splitlines()
    headers = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    if not headers:
        return tail
    start = i = headers[-1]
    while i > 0 and _stack_line(lines[i - 1]):  # the dump's earlier threads, listed just before
        i -= 1
        if _HEADER.match(lines[i]):
            start = i
    return "\n".join(lines[start:])


def stalled_error(worker: str, silent_seconds: float | None, tail: str, max_chars: int) -> str:
    """``Stalled: ...`` (a stable first line: the fingerprint), then the child's Python stack."""
    head = (f"Stalled: worker {worker} sent nothing and used no CPU for longer than its stall timeout; "
            "its stack was dumped and it was stopped")
    if silent_seconds is not None:
        head += f"\n(silent for {silent_seconds:.0f} s)"
    stack = stack_in(tail.strip())
    if not stack:
        return head[:max_chars]
    sep = "\n--- the child's Python stack (faulthandler) ---\n"
    room = max_chars - len(head) - len(sep)
    return head if room <= 0 else head + sep + stack[-room:]
