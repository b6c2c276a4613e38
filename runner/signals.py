"""Signals reach the supervisor's loop through a self-pipe, never through a callback.

``signal.set_wakeup_fd`` writes each signal's number to the pipe; the handlers themselves do nothing;
the loop's ``select`` wakes on the pipe and ``SignalPipe.read`` returns the numbers (the arbiter's way).
"""
from __future__ import annotations

import os
import signal
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD)


def _noop_handler(signum: int, frame: Any) -> None:
    """The real work happens in the loop: set_wakeup_fd has already written the signal number."""


class SignalPipe:
    def __init__(self) -> None:
        self.read_fd: int | None = None
        self._write_fd: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self._old_wakeup: int | None = None

    def install(self) -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in HANDLED:
            self._old_handlers[sig] = signal.signal(sig, _noop_handler)

    def restore(self) -> None:
        if not self._old_handlers:
            return
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
        for fd in (self.read_fd, self._write_fd):
            if fd is not None:
                os.close(fd)
        self.read_fd = self._write_fd = None

    def read(self) -> list[int]:
        """The signals received since the last read, in order."""
        if self.read_fd is None:
            return []
        try:
            return list(os.read(self.read_fd, 512))
        except BlockingIOError:
            return []
