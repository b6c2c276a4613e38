"""The API process's own metrics, kept by prometheus_client (per process: each uvicorn worker counts what
it saw) and appended to GET /metrics after the figures read from the database."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

#: This module's registry (not the library's global one, which also carries the process's platform
#: collectors): what /metrics shows of the API's own counters.
REGISTRY = CollectorRegistry(auto_describe=True)

EVENTS_DROPPED = Counter(
    "scrinalia_events_dropped_total",
    "Notifications on the ledger's channel that the live relay dropped, by reason (not JSON within the "
    "bounds, not the shape the ledger's triggers send: anyone with a database login may NOTIFY)",
    ["reason"],
    registry=REGISTRY,
)


def event_dropped(reason: str) -> None:
    """The relay's ``on_drop``: one more dropped notification of ``reason``."""
    EVENTS_DROPPED.labels(reason=reason).inc()


def exposition() -> str:
    """The registry in the Prometheus text format (0.0.4)."""
    return generate_latest(REGISTRY).decode()
