"""Schedules: a worker and a request to enqueue every ``interval_seconds``.

One schedule per worker: two would share the worker's one slot and starve each other without a sign,
so a second is refused (``ScheduleExists``); change the one there is instead. A schedule's request is
validated by the shared validation (``workers.validation``) when it is added AND at every tick, against
the catalogue and the persisted settings of the moment: a tick whose request no longer validates (the
worker left the catalogue, its settings changed) writes no run and records ``refused: <why>``.

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

from sqlalchemy import Connection, Engine, text

from scrinalia.db.engine import one_statement
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import InvalidRunRequest, LedgerError, WorkerRunAlreadyActive
from scrinalia.domains.archive.workers.validation import Catalogue, validate_run_request


class ScheduleExists(LedgerError):
    """The worker already has a schedule (``existing``): one per worker, so none starves another."""

    def __init__(self, worker_name: str, existing: int) -> None:
        super().__init__(f"worker {worker_name!r} already has schedule {existing}; enable, disable or remove "
                         f"that one instead of adding another")
        self.worker_name = worker_name
        self.existing = existing


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
    # Crash-loop quarantine (scheduler.quarantine, decision 0165): set by the scheduler with enabled off.
    quarantined_at: datetime | None = None
    quarantine_reason: str | None = None
    quarantine_fingerprint: str | None = None
    quarantine_run_id: uuid.UUID | None = None
    quarantine_resumed_at: datetime | None = None
    quarantine_resumed_by: str | None = None

    @property
    def quarantined(self) -> bool:
        """Paused by the scheduler for a crash loop (and not enabled since, by any release)."""
        return self.quarantined_at is not None and not self.enabled


_COLUMNS = ("id, worker_name, interval_seconds, request, enabled, next_run_at, last_tick_at, last_run_id, "
            "last_outcome, quarantined_at, quarantine_reason, quarantine_fingerprint, quarantine_run_id, "
            "quarantine_resumed_at, quarantine_resumed_by")

# Serialises the adds of one worker (transaction-scoped), so the existence check below cannot race.
_LOCK_WORKER = text("SELECT pg_advisory_xact_lock(hashtext('archive_worker_schedules'), hashtext(:worker_name))")
_EXISTING = text("SELECT min(id) FROM archive_worker_schedules WHERE worker_name = :worker_name")
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
_GET = text(f"SELECT {_COLUMNS} FROM archive_worker_schedules WHERE id = :id")
# Enabling a quarantined schedule resumes it (the quarantine cleared, the resume recorded, as
# quarantine.resume does); disabling one leaves its quarantine as it is.
_SET_ENABLED = text(
    f"""
    UPDATE archive_worker_schedules
       SET enabled = :enabled, updated_at = now(),
           quarantine_resumed_at = CASE WHEN :enabled AND quarantined_at IS NOT NULL THEN now()
                                        ELSE quarantine_resumed_at END,
           quarantine_resumed_by = CASE WHEN :enabled AND quarantined_at IS NOT NULL THEN CAST(:by AS text)
                                        ELSE quarantine_resumed_by END,
           quarantined_at = CASE WHEN :enabled THEN NULL ELSE quarantined_at END,
           quarantine_reason = CASE WHEN :enabled THEN NULL ELSE quarantine_reason END,
           quarantine_fingerprint = CASE WHEN :enabled THEN NULL ELSE quarantine_fingerprint END,
           quarantine_run_id = CASE WHEN :enabled THEN NULL ELSE quarantine_run_id END
     WHERE id = :id
    RETURNING {_COLUMNS}
    """
)
_DELETE = text("DELETE FROM archive_worker_schedules WHERE id = :id")


def create_schedule(engine: Engine, worker_name: str, interval_seconds: int, request: dict[str, Any] | None = None,
                    *, catalogue: Catalogue, created_by: str | None = None, first_delay_s: float = 0) -> Schedule:
    """Add the worker's schedule. Raises ``InvalidRunRequest`` (the shared validation; nothing written),
    ``ValueError`` (the interval) and ``ScheduleExists``."""
    ledger.validate_worker_name(worker_name)
    clean = validate_run_request(catalogue, engine, worker_name, request or {})
    if interval_seconds < 60:
        raise ValueError("interval_seconds must be at least 60")
    with engine.begin() as conn:
        conn.execute(_LOCK_WORKER, {"worker_name": worker_name})
        existing = conn.execute(_EXISTING, {"worker_name": worker_name}).scalar()
        if existing is not None:
            raise ScheduleExists(worker_name, existing)
        row = conn.execute(_CREATE, {"worker_name": worker_name, "interval_seconds": interval_seconds,
                                     "request": json.dumps(clean), "created_by": created_by,
                                     "first_delay_s": float(first_delay_s)}).one()
    return Schedule(**row._mapping)


def list_schedules(engine: Engine | Connection) -> list[Schedule]:
    with one_statement(engine) as conn:
        return [Schedule(**r._mapping) for r in conn.execute(_LIST).all()]


_QUARANTINED = text(f"SELECT {_COLUMNS} FROM archive_worker_schedules WHERE quarantined_at IS NOT NULL AND NOT enabled "
                    "ORDER BY worker_name, id")


def quarantined_schedules(engine: Engine | Connection) -> list[Schedule]:
    """The schedules the scheduler has quarantined (a handful at most: read whole)."""
    with one_statement(engine) as conn:
        return [Schedule(**r._mapping) for r in conn.execute(_QUARANTINED).all()]


def get_schedule(engine: Engine, schedule_id: int) -> Schedule | None:
    with engine.connect() as conn:
        row = conn.execute(_GET, {"id": schedule_id}).one_or_none()
    return Schedule(**row._mapping) if row is not None else None


_QUEUED_OF_SCHEDULE = text("SELECT run_id FROM archive_worker_runs WHERE schedule_id = :id AND status = 'QUEUED'")


def set_enabled(engine: Engine, schedule_id: int, enabled: bool, *, by: str | None = None) -> Schedule | None:
    """Enable or disable a schedule; None when there is no such schedule.

    Disabling also cancels what the schedule left QUEUED (a retry waiting out its backoff holds the
    worker's slot: a disabled schedule must not keep a manual Run out). A RUNNING run is left alone."""
    with engine.begin() as conn:
        row = conn.execute(_SET_ENABLED, {"id": schedule_id, "enabled": enabled, "by": by}).one_or_none()
        queued = ([] if enabled or row is None
                  else list(conn.execute(_QUEUED_OF_SCHEDULE, {"id": schedule_id}).scalars()))
    for run_id in queued:
        try:
            ledger.request_cancel(engine, run_id, requested_by=by or "schedule disabled")
        except LedgerError:
            pass  # claimed or ended meanwhile: no longer a queued run of the schedule
    return Schedule(**row._mapping) if row is not None else None


def delete_schedule(engine: Engine, schedule_id: int) -> bool:
    """Remove a schedule; its past runs keep their rows (``schedule_id`` becomes NULL)."""
    with engine.begin() as conn:
        return conn.execute(_DELETE, {"id": schedule_id}).rowcount == 1


@dataclass(frozen=True, slots=True)
class TickOutcome:
    schedule_id: int
    worker_name: str
    outcome: str  # "enqueued" | "skipped-busy" | "refused: <field>: <why>"
    run_id: uuid.UUID | None


REFUSED_PREFIX = "refused: "


def fire_due_schedules(engine: Engine, catalogue: Catalogue) -> list[TickOutcome]:
    """Enqueue a SCHEDULE run for every due schedule whose request still validates (``catalogue``: the
    workers as the runners know them). Call it only while holding the leadership."""
    with engine.connect() as conn:
        due = [Schedule(**r._mapping) for r in conn.execute(_DUE).all()]
    outcomes = []
    for schedule in due:
        try:
            clean = validate_run_request(catalogue, engine, schedule.worker_name, schedule.request)
            run = ledger.enqueue(engine, schedule.worker_name, clean, trigger="SCHEDULE",
                                 requested_by="scheduler", schedule_id=schedule.id)
            outcome = TickOutcome(schedule.id, schedule.worker_name, "enqueued", run.run_id)
        except InvalidRunRequest as exc:
            outcome = TickOutcome(schedule.id, schedule.worker_name, (REFUSED_PREFIX + str(exc))[:500], None)
        except WorkerRunAlreadyActive:
            outcome = TickOutcome(schedule.id, schedule.worker_name, "skipped-busy", None)
        with engine.begin() as conn:
            conn.execute(_RECORD_TICK, {"id": schedule.id, "outcome": outcome.outcome,
                                        "run_id": str(outcome.run_id) if outcome.run_id else None})
        outcomes.append(outcome)
    return outcomes
