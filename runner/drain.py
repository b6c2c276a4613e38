"""The drain: stop claiming, let the children finish until the drain timeout, then stop them.

One object owns the drain's state and the runner's exit code; the phases that may start a drain (the
signals, the heartbeat's registry request, the control socket, a fork server that cannot restart) are
given it explicitly.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from runner.ports import Clock

log = logging.getLogger("scrinalia.runner")


class Drain:
    def __init__(self, clock: Clock, drain_timeout: float, notifier: Any, busy: Callable[[], int]) -> None:
        self.clock = clock
        self.drain_timeout = drain_timeout
        self.notifier = notifier
        self.busy = busy                         # how many children run now (for the log line)
        self.draining = False
        self.reason: str | None = None
        self.deadline: float | None = None       # CLOCK_MONOTONIC: the remaining children are stopped then
        self.interrupts = 0                      # the one-shot CLI's Ctrl-C count
        self.exit_code = 0

    def begin(self, why: str) -> None:
        """Stop claiming; let the children finish until the drain timeout; then stop them."""
        if self.draining:
            return
        self.draining, self.reason = True, why
        self.deadline = self.clock.monotonic() + self.drain_timeout
        log.warning("draining (%s): no more claims; %d running, deadline in %gs", why, self.busy(), self.drain_timeout)
        if self.notifier is not None:
            self.notifier.stopping(f"draining: {why}")

    def stop_now(self, why: str) -> None:
        if not self.draining:
            self.begin(why)
        log.warning("stopping now (%s)", why)
        self.deadline = self.clock.monotonic()

    def fail(self, why: str) -> None:
        """Stop now, and exit 1 (a fork server that cannot be restarted)."""
        self.exit_code = 1
        self.stop_now(why)

    def deadline_if_draining(self) -> float | None:
        return self.deadline if self.draining else None
