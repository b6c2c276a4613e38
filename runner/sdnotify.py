"""sd_notify without libsystemd: READY, WATCHDOG, STOPPING and STATUS datagrams to $NOTIFY_SOCKET."""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("scrinalia.runner.sdnotify")


class Notifier:
    """Does nothing when NOTIFY_SOCKET is unset (not under systemd Type=notify)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET") or None
        self._address: str | bytes | None = None
        if path:
            self._address = "\0" + path[1:] if path.startswith("@") else path
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        if usec and (not pid or pid == str(os.getpid())):
            try:
                # systemd's advice: ping at half the timeout.
                self.watchdog_interval = max(0.05, int(usec) / 1e6 / 2)
            except ValueError:
                self.watchdog_interval = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *lines: str) -> bool:
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode(), self._address)
            return True
        except OSError as exc:
            log.warning("sd_notify failed: %s", exc)
            return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *( [f"STATUS={status}"] if status else []), f"MAINPID={os.getpid()}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))
