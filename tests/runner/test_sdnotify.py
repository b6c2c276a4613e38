"""sd_notify: READY, WATCHDOG and STOPPING reach $NOTIFY_SOCKET (as under systemd Type=notify)."""
from __future__ import annotations

import os
import signal
import socket

import pytest

from runner.sdnotify import Notifier
from tests.runner.conftest import wait_for

pytestmark = pytest.mark.slow


def test_the_supervisor_notifies_ready_watchdog_and_stopping(start_runner, runner_env, tmp_path):
    path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.setblocking(False)
    received: list[str] = []

    def drain():
        while True:
            try:
                received.append(listener.recv(4096).decode())
            except BlockingIOError:
                return

    env = dict(runner_env, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="400000")
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", env=env)

    def seen(line):
        drain()
        return any(line in message.split("\n") for message in received)

    wait_for(lambda: seen("READY=1"), 10, what="READY=1")
    ready = next(m for m in received if "READY=1" in m)
    assert f"MAINPID={runner.pid}" in ready and "STATUS=running" in ready
    wait_for(lambda: drain() or sum("WATCHDOG=1" in m for m in received) >= 3, 10, what="WATCHDOG=1 pings")
    runner.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: seen("STOPPING=1"), 10, what="STOPPING=1")
    assert runner.wait_exit(30) == 0
    listener.close()


def test_the_notifier_does_nothing_without_notify_socket():
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval is None
    assert notifier.ready() is False


def test_an_abstract_notify_socket_is_addressed_with_a_nul_byte():
    name = f"scrinalia-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "2000000"}).watchdog()
        assert listener.recv(100) == b"WATCHDOG=1"
        assert Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "2000000"}).watchdog_interval == 1.0
    finally:
        listener.close()
