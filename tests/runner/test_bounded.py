"""``runner.bounded`` against a real PostgreSQL behind a proxy that accepts bytes and never answers:
a statement is abandoned at its bound (or at the caller's earlier limit), a new connection at the
connect bound, and the engine works again once the network does (decision 0110)."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from runner import bounded
from runner.database import parent_engine
from runner.options import RunnerOptions
from tests.runner import netfault


@pytest.fixture
def proxied(database_url):
    proxy = netfault.SilentProxy("127.0.0.1", netfault.cluster_port(database_url))
    options = RunnerOptions(name="x", heartbeat_seconds=1, lease_seconds=4).validate()  # bounds 1.25 s
    engine = parent_engine(netfault.through_proxy(database_url, proxy), options)
    yield proxy, engine, options
    engine.dispose()
    proxy.close()


def _select(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT 1")).scalar_one()


def test_a_silent_network_costs_a_step_its_bound_and_no_more(proxied):
    proxy, engine, options = proxied
    assert _select(engine) == 1  # a pooled connection, then the silence
    proxy.silence()
    try:
        began = time.monotonic()
        with pytest.raises(OperationalError):
            _select(engine)       # the pooled connection: abandoned at the statement bound
        took = time.monotonic() - began
        assert options.statement_seconds - 0.05 <= took < options.statement_seconds + 1.0, took
        began = time.monotonic()
        with pytest.raises(OperationalError, match="abandoned"):
            _select(engine)       # a new connection: abandoned at the connect bound
        took = time.monotonic() - began
        assert took < options.connect_seconds + 1.0, took
        began = time.monotonic()
        with bounded.until(engine, time.monotonic() + 0.3), pytest.raises(OperationalError):
            _select(engine)       # the caller's limit (the fence point) comes first
        assert time.monotonic() - began < 0.3 + 0.7
    finally:
        proxy.heal()
    assert _select(engine) == 1   # the network answers: so does the engine
    assert bounded.guard_of(engine).abandoned >= 1
