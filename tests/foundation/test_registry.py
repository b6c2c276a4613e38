"""The runner registry: online, stale and stopped by the database's clock."""
from __future__ import annotations

from sqlalchemy import text

from scrinalia.domains.archive import ledger, registry
from tests.ledger.helpers import register_runner


def test_register_heartbeat_stale_and_stop(engine):
    alive = register_runner(engine, ["a"], lease=60, name="alive")
    stale = register_runner(engine, ["b"], lease=60, name="stale")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runners SET last_heartbeat_at = now() - interval '2 minutes' "
                          "WHERE runner_id = :r"), {"r": stale})
    states = {r.name: r.state for r in registry.list_runners(engine)}
    assert states == {"alive": "online", "stale": "stale"}

    assert ledger.heartbeat(engine, stale, 60).registry_renewed
    assert registry.get_runner(engine, stale).state == "online"

    assert registry.request_drain(engine, alive, requested_by="ana")
    row = registry.get_runner(engine, alive)
    assert row.drain_requested_at is not None and row.drain_requested_by == "ana"

    assert registry.stop(engine, alive) and not registry.stop(engine, alive)
    assert registry.get_runner(engine, alive).state == "stopped"
    assert not registry.request_drain(engine, alive)
    row = registry.get_runner(engine, stale)
    assert row.capabilities == ["b"] and row.package_version == "test" and row.lease_seconds == 60
