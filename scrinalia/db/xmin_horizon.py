"""The oldest holder of the database's xmin horizon: why the ledger's tables grow (decision 0371).

While a session holds an old snapshot (an analyst's REPEATABLE READ transaction, a pg_dump, a client left
idle in a transaction), a prepared transaction stays open or a replication slot lags, VACUUM cannot remove
the row versions the runner's heartbeats and finishes leave behind, and the hot tables grow. One bounded
read (``archive_oldest_xmin()``, migration 0018: the server's views of its sessions, prepared transactions
and slots, never the ledger) names the oldest; ``/metrics``, ``scrinalia-runner status`` and the panel's
runners page show it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

_OLDEST = text("SELECT kind, age_seconds, age_xids, pid, application_name, state, holder FROM archive_oldest_xmin()")


@dataclass(frozen=True, slots=True)
class XminHolder:
    """``kind``: session | prepared | slot; ``age_seconds``: since its transaction started (a session), since
    it was prepared, or None (a slot has no time); ``age_xids``: transactions since its xmin."""

    kind: str
    age_seconds: float | None
    age_xids: int
    pid: int | None
    application_name: str | None
    state: str | None
    holder: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "age_seconds": self.age_seconds, "age_xids": self.age_xids, "pid": self.pid,
                "application_name": self.application_name, "state": self.state, "holder": self.holder,
                "text": describe(self)}


def oldest_xmin(conn: Any) -> XminHolder | None:
    """The oldest holder now, other than this connection's own statement; None when none holds one."""
    row = conn.execute(_OLDEST).one_or_none()
    if row is None:
        return None
    return XminHolder(kind=row.kind, age_seconds=None if row.age_seconds is None else float(row.age_seconds),
                      age_xids=int(row.age_xids or 0), pid=row.pid, application_name=row.application_name,
                      state=row.state, holder=row.holder or "")


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def describe(h: XminHolder | None) -> str:
    """One line for an operator: how old, and who."""
    if h is None:
        return "no transaction holds the xmin horizon back"
    if h.kind == "slot":
        return f"replication slot {h.holder} ({h.state}) holds the xmin horizon {h.age_xids} transactions back"
    age = _age(h.age_seconds or 0.0)
    if h.kind == "prepared":
        return f"prepared transaction {h.holder} holds the xmin horizon since {age}"
    who = h.application_name or "a client"
    return f"oldest xmin held {age} by pid {h.pid} ({who}, {h.state or 'unknown state'})"
