"""The runner registry (``archive_worker_runners``): who is online, what can it run, who claimed what.

A runner registers once at start, is renewed inside the ledger's batched heartbeat (one statement for
its row and all its runs), and marks itself stopped when it exits. Online/stale is decided with the
database clock against the runner's own lease.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.types import Text

from scrinalia.db.engine import one_statement
from scrinalia.domains.archive.queries import QUERIES


@dataclass(frozen=True, slots=True)
class RunnerRegistration:
    """What a runner says about itself at start. It holds no secret (no URL, no password)."""

    runner_id: uuid.UUID
    name: str
    hostname: str
    pid: int
    package_version: str
    schema_revision: str | None
    capabilities: list[str]
    concurrency: int
    heartbeat_seconds: float
    lease_seconds: float
    poll_seconds: float | None = None
    kind: str = "daemon"
    devices: list[dict[str, Any]] = field(default_factory=list)
    sees: dict[str, Any] = field(default_factory=dict)  # model_dirs.seen_model_dirs (decision 0145)


@dataclass(frozen=True, slots=True)
class RunnerRow:
    runner_id: uuid.UUID
    name: str
    kind: str
    hostname: str
    pid: int
    package_version: str
    schema_revision: str | None
    capabilities: list[str]
    concurrency: int
    heartbeat_seconds: float
    lease_seconds: float
    poll_seconds: float | None
    devices: list[dict[str, Any]]
    children: list[dict[str, Any]]
    sees: dict[str, Any]
    warm: dict[str, Any]  # the fork server's warm models, as the heartbeat last wrote them (decision 0381)
    started_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    drain_requested_at: datetime | None
    drain_requested_by: str | None
    state: str  # online | stale | stopped


_REGISTER = QUERIES["register"].text().bindparams(
    bindparam("runner_id", type_=UUID(as_uuid=True)), bindparam("capabilities", type_=ARRAY(Text)))

_STOP = QUERIES["stop"].text().bindparams(bindparam("runner_id", type_=UUID(as_uuid=True)))

_REQUEST_DRAIN = QUERIES["request_drain"].text().bindparams(bindparam("runner_id", type_=UUID(as_uuid=True)))

# A runner is online while its last heartbeat is younger than its lease, by the database's clock.
_STATE = """
    CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
         WHEN last_heartbeat_at + make_interval(secs => lease_seconds) >= now() THEN 'online'
         ELSE 'stale' END AS state
"""

#: What a runner reports of its host: in its own row from migration 0023 on, in the registry row before
#: (a runner registered earlier has no report row). Every reader sees one column each (decision 0395).
#: The report row first: for a runner that has one, the registry row's own columns hold only defaults.
_REPORTED = ("devices", "sees", "warm")
_FROM_REPORT = ("COALESCE((SELECT rp.{c} FROM archive_worker_runner_reports AS rp "
                "WHERE rp.runner_id = archive_worker_runners.runner_id), archive_worker_runners.{c}) AS {c}")
_COLUMNS = ", ".join(_FROM_REPORT.format(c=f.name) if f.name in _REPORTED else f.name
                     for f in fields(RunnerRow) if f.name != "state")

_LIST = text(
    f"""
    SELECT {_COLUMNS}, {_STATE}
      FROM archive_worker_runners
     WHERE stopped_at IS NULL OR stopped_at > now() - make_interval(hours => :stopped_within_hours)
     ORDER BY stopped_at IS NOT NULL, name, started_at DESC
     LIMIT :limit
    """
)

_GET = text(f"SELECT {_COLUMNS}, {_STATE} FROM archive_worker_runners WHERE runner_id = :runner_id").bindparams(
    bindparam("runner_id", type_=UUID(as_uuid=True))
)


def register(engine: Engine, registration: RunnerRegistration) -> None:
    params = {f.name: getattr(registration, f.name) for f in fields(RunnerRegistration)}
    params["devices"] = json.dumps(registration.devices)
    params["sees"] = json.dumps(registration.sees)
    with one_statement(engine) as conn:
        conn.execute(_REGISTER, params)


def stop(engine: Engine, runner_id: uuid.UUID) -> bool:
    with one_statement(engine) as conn:
        return conn.execute(_STOP, {"runner_id": runner_id}).rowcount == 1


def request_drain(engine: Engine, runner_id: uuid.UUID, requested_by: str | None = None) -> bool:
    """Ask a runner to drain; it learns it from its next heartbeat. False for an unknown/stopped one."""
    with one_statement(engine) as conn:
        return conn.execute(_REQUEST_DRAIN, {"runner_id": runner_id, "requested_by": requested_by}).first() is not None


def list_runners(engine: Engine | Connection, *, stopped_within_hours: int = 24, limit: int = 500) -> list[RunnerRow]:
    with one_statement(engine) as conn:
        rows = conn.execute(_LIST, {"stopped_within_hours": stopped_within_hours, "limit": limit}).all()
    return [RunnerRow(**r._mapping) for r in rows]


def get_runner(engine: Engine, runner_id: uuid.UUID) -> RunnerRow | None:
    with one_statement(engine) as conn:
        row = conn.execute(_GET, {"runner_id": runner_id}).one_or_none()
    return RunnerRow(**row._mapping) if row is not None else None
