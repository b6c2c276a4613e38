"""The supervisor's LISTEN connection resolves a host name off the loop (issue 9): libpq would resolve it
inside ``connect_start``, synchronously, holding the supervisor's loop for as long as DNS takes."""
from __future__ import annotations

import socket
import time

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive.ledger_events import RESYNC, LedgerListener, conninfo_for


def _by_name(database_url: str) -> Engine:
    url = make_url(database_url)
    if url.host != "127.0.0.1":
        pytest.skip("needs the local test cluster on 127.0.0.1")
    return create_engine_from_url(url.set(host="localhost").render_as_string(hide_password=False))


def test_a_slow_dns_answer_never_holds_the_step(database_url, monkeypatch):
    engine = _by_name(database_url)
    real = socket.getaddrinfo
    calls = []

    def slow_dns(host, *args, **kwargs):  # a resolver that takes 2 s to answer
        calls.append(host)
        time.sleep(2.0)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_dns)
    listener = LedgerListener(conninfo_for(engine, application_name="test-dns"), name="dns")
    try:
        slowest, events = 0.0, []
        deadline = time.monotonic() + 20
        while RESYNC not in events:
            assert time.monotonic() < deadline, f"never listening: {listener.last_error}"
            began = time.monotonic()
            events = listener.step()
            slowest = max(slowest, time.monotonic() - began)
            time.sleep(0.01)
        assert calls == ["localhost"]
        assert slowest < 0.5, f"one step took {slowest:.2f}s"
        assert listener.listening
    finally:
        listener.close()
        engine.dispose()
