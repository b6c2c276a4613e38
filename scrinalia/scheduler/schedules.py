"""Schedules: a worker and a request to enqueue every ``interval_seconds``.

A tick while the worker's slot is busy is skipped, not queued (the queue is a slot). A scheduler that
was down for several intervals fires once on its return (one catch-up), and the next tick is the next
interval boundary after now: no replay of the missed ones.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import WorkerRunAlreadyActive


@dataclass(frozen=True, slots=True)
class Schedule:
    id: int
    worker_name: str
    interval_seconds: int
    request: dict[str, Any]
    enabled: bool
    next_run_at: datetime
    last_tick_at: datetime | None
    last_run_id: uuid.UUID | None
    last_outcome: str | None


_COLUMNS = "id, worker_name, interval_seconds, request, enabled, next_run_at, last_tick_at, last_run_id, last_outcome"

_CREATE = text(
    f"""
    INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, created_by, next_run_at)
    VALUES (:worker_name, :interval_seconds, CAST(:request AS jsonb), :created_by,
            now() + make_interval(secs => :first_delay_s))
    RETURNING {_COLUMNS}
    """
)

_DUE = text(
    f"SELECT {_COLUMNS} FROM archive_worker_schedules WHERE enabled AND next_run_at <= now() ORDER BY next_run_at, id"
)

# The next tick is the first interval boundary strictly after now(): missed ticks collapse into one.
_RECORD_TICK = text(
    """
    UPDATE archive_worker_schedules
       SET last_tick_at = now(),
           last_outcome = :outcome,
           last_run_id = COALESCE(CAST(:run_id AS uuid), last_run_id),
           next_run_at = next_run_at + make_interval(secs => interval_seconds *
                 (floor(extract(epoch FROM now() - next_run_at) / interval_seconds) + 1)),
           updated_at = now()
     WHERE id = :id AND next_run_at <= now()
    """
)

_LIST = text(f"SELECT {_COLUMNS} FROM archive_worker_schedules ORDER BY worker_name, id")
_SET_ENABLED = text(f"UPDATE archive_worker_schedules SET enabled = :enabled, updated_at = now() WHERE id = :id RETURNING {_COLUMNS}")
_DELETE = text("DELETE FROM archive_worker_schedules WHERE id = :id")


def create_schedule(engine: Engine, worker_name: str, interval_seconds: int, request: dict[str, Any] | None = None,
                    *, created_by: str | None = None, first_delay_s: float = 0) -> Schedule:
    ledger.validate_worker_name(worker_name)
    clean = ledger.validate_request(request or {})
    if interval_seconds < 60:
        raise ValueError("interval_seconds must be at least 60")
    with engine.begin() as conn:
        row = conn.execute(_CREATE, {"worker_name": worker_name, "interval_seconds": interval_seconds,
                                     "request": json.dumps(clean), "created_by": created_by,
                                     "first_delay_s": float(first_delay_s)}).one()
    return Schedule(**row._mapping)


def list_schedules(engine: Engine) -> list[Schedule]:
    with engine.connect() as conn:
        return [Schedule(**r._mapping) for r in conn.execute(_LIST).all()]


def set_enabled(engine: Engine, schedule_id: int, enabled: bool) -> Schedule | None:
    """Enable or disable a schedule; None when there is no such schedule."""
    with engine.begin() as conn:
        row = conn.execute(_SET_ENABLED, {"id": schedule_id, "enabled": enabled}).one_or_none()
    return Schedule(**row._mapping) if row is not None else None


def delete_schedule(engine: Engine, schedule_id: int) -> bool:
    """Remove a schedule; its past runs keep their rows (``schedule_id`` becomes NULL)."""
    with engine.begin() as conn:
        return conn.execute(_DELETE, {"id": schedule_id}).rowcount == 1


@dataclass(frozen=True, slots=True)
class TickOutcome:
    schedule_id: int
    worker_name: str
    outcome: str  # "enqueued" | "skipped-busy"
    run_id: uuid.UUID | None


def fire_due_schedules(engine: Engine) -> list[TickOutcome]:
    """Enqueue a SCHEDULE run for every due schedule. Call it only while holding the leadership."""
    with engine.connect() as conn:
        due = [Schedule(**r._mapping) for r in conn.execute(_DUE).all()]
    outcomes = []
    for schedule in due:
        try:
            run = ledger.enqueue(engine, schedule.worker_name, schedule.request, trigger="SCHEDULE",
                                 requested_by="scheduler", schedule_id=schedule.id)
            outcome = TickOutcome(schedule.id, schedule.worker_name, "enqueued", run.run_id)
        except WorkerRunAlreadyActive:
            outcome = TickOutcome(schedule.id, schedule.worker_name, "skipped-busy", None)
        with engine.begin() as conn:
            conn.execute(_RECORD_TICK, {"id": schedule.id, "outcome": outcome.outcome,
                                        "run_id": str(outcome.run_id) if outcome.run_id else None})
        outcomes.append(outcome)
    return outcomes
