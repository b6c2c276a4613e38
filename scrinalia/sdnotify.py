"""sd_notify for the API and the scheduler (the runner has its own, runner.sdnotify, with the watchdog):
READY, STATUS and STOPPING datagrams to ``$NOTIFY_SOCKET``; nothing when it is unset (not under systemd).

Their units are ``Type=notify``: ``systemctl start`` returns, and the unit is ``active``, only once the
service has said it is ready (the API: answering ``/healthz``; the scheduler: its schema checked).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

log = logging.getLogger("scrinalia.sdnotify")


def notify(*lines: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``lines`` (``READY=1``, ``STATUS=...``) to systemd; False when not under systemd or it failed."""
    path = (os.environ if environ is None else environ).get("NOTIFY_SOCKET") or ""
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(lines).encode(), address)
        return True
    except OSError as exc:
        log.warning("sd_notify failed: %s", exc)
        return False


def ready_when_healthy(url: str, status: str, interval: float = 0.2) -> threading.Thread | None:
    """Under systemd: a daemon thread of the API's main process that sends READY=1 (with ``status``) once
    ``url`` (its /healthz) answers 200, so the unit turns active only when the API answers. None elsewhere."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return None

    def wait_then_notify() -> None:
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(interval)

    thread = threading.Thread(target=wait_then_notify, name="sd-notify-ready", daemon=True)
    thread.start()
    return thread
