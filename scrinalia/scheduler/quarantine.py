"""Crash-loop quarantine: a schedule whose last N retry chains ended FAILED the same way is paused.

The retry policy is per run (three attempts), so a schedule whose worker fails the same way at every
tick would burn three attempts per tick forever. A *retry chain* is a scheduled run and its retries
(``retry_of``); it has *ended* when its last run is final and nothing will retry it (the last attempt,
a ``configuration`` failure, a success or a cancel, or a later run of the schedule or of the worker took
over). When the last N chain ends of a schedule (``SCHEDULER_QUARANTINE_AFTER``, default 3; 0 turns it
off) are all FAILED with one and the same ``error_fingerprint``, the scheduler quarantines it: the
schedule is disabled (as a disable does, so a scheduler of the previous release leaves it alone too)
with ``quarantined_at``, the reason, the fingerprint and the last failed run. Chains that ended before
the quarantine's resume do not count again, so a resumed schedule gets N fresh chains.

Only SCHEDULE runs count: a manual (API) or CLI run is never quarantined and never counts, not even a
manual retry of a scheduled run. Decision 0165.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text

from scrinalia.scheduler.retry import MAX_ATTEMPTS
from scrinalia.scheduler.schedules import get_schedule

#: The default of ``SCHEDULER_QUARANTINE_AFTER``: chains in a row that ended FAILED the same way.
DEFAULT_AFTER = 3

# One statement for every enabled schedule: each one's latest scheduled runs (ix_worker_runs_schedule_id,
# at most (n + 1) chains of MAX_ATTEMPTS runs), the chain ends among them, the newest n of those, and
# the schedules whose n ends are all FAILED with one fingerprint are disabled with the reason (a later
# run of the worker: max(id) of ix_worker_runs_worker_id, one index probe per candidate run). A chain
# continues into the next scheduled run when that run is its retry (a retry is always the worker's very
# next run: the policy retries only a worker's latest run). Counting starts after the last quarantine
# (a resume, or an enable by a release that knows no quarantine).
_QUARANTINE_CRASH_LOOPS = text(
    """
    WITH candidates AS (
        SELECT s.id, GREATEST(s.quarantined_at, s.quarantine_resumed_at) AS counted_after
          FROM archive_worker_schedules s
         WHERE s.enabled
    ), recent AS (
        SELECT c.id AS schedule_id, c.counted_after, r.*,
               lead(r.retry_of) OVER w AS next_retry_of, lead(r.id) OVER w AS next_id
          FROM candidates c
          CROSS JOIN LATERAL (
                SELECT x.id, x.run_id, x.worker_name, x.status, x.attempt, x.exit_reason, x.error_fingerprint,
                       x.retry_of, x.finished_at
                  FROM archive_worker_runs x
                 WHERE x.schedule_id = c.id AND x.trigger = 'SCHEDULE'
                 ORDER BY x.id DESC
                 LIMIT :scan) AS r
        WINDOW w AS (PARTITION BY c.id ORDER BY r.id)
    ), ends AS (
        SELECT e.*, row_number() OVER (PARTITION BY e.schedule_id ORDER BY e.id DESC) AS k
          FROM recent e
         WHERE e.status NOT IN ('QUEUED', 'RUNNING')
           AND e.next_retry_of IS DISTINCT FROM e.run_id
           AND (e.next_id IS NOT NULL OR e.status NOT IN ('FAILED', 'INTERRUPTED') OR e.attempt >= :max_attempts
                OR e.exit_reason = 'configuration'
                OR e.id < (SELECT max(later.id) FROM archive_worker_runs later
                            WHERE later.worker_name = e.worker_name))
           AND e.finished_at > COALESCE(e.counted_after, '-infinity'::timestamptz)
    ), loops AS (
        SELECT schedule_id, min(error_fingerprint) AS fingerprint,
               (array_agg(run_id ORDER BY id DESC))[1] AS run_id
          FROM ends
         WHERE k <= :after
         GROUP BY schedule_id
        HAVING count(*) = :after AND bool_and(status = 'FAILED') AND bool_and(error_fingerprint IS NOT NULL)
           AND count(DISTINCT error_fingerprint) = 1
    )
    UPDATE archive_worker_schedules AS s
       SET enabled = false, quarantined_at = now(), quarantine_reason = :reason,
           quarantine_fingerprint = l.fingerprint, quarantine_run_id = l.run_id, updated_at = now()
      FROM loops AS l
     WHERE s.id = l.schedule_id AND s.enabled
    RETURNING s.id, s.worker_name, s.quarantine_fingerprint, s.quarantine_run_id, s.quarantine_reason
    """
)

# Resume: enabled again, the quarantine cleared, and when and by whom (so its chains are not counted again).
_RESUME = text(
    """
    UPDATE archive_worker_schedules
       SET enabled = true, quarantined_at = NULL, quarantine_reason = NULL, quarantine_fingerprint = NULL,
           quarantine_run_id = NULL, quarantine_resumed_at = now(), quarantine_resumed_by = :by, updated_at = now()
     WHERE id = :id AND quarantined_at IS NOT NULL AND NOT enabled
    RETURNING id
    """
)


@dataclass(frozen=True, slots=True)
class Quarantine:
    """A schedule the scheduler has just quarantined."""

    schedule_id: int
    worker_name: str
    fingerprint: str
    run_id: uuid.UUID
    reason: str


def reason_text(after: int) -> str:
    return f"crash loop: the last {after} retry chains ended FAILED with the same error"


def quarantine_crash_loops(engine: Engine, after: int = DEFAULT_AFTER) -> list[Quarantine]:
    """Quarantine every enabled schedule whose last ``after`` retry chains ended FAILED with one
    fingerprint (``after`` 0: never). Call it only while holding the leadership, after the retries."""
    if after <= 0:
        return []
    params = {"after": after, "scan": (after + 1) * MAX_ATTEMPTS, "max_attempts": MAX_ATTEMPTS,
              "reason": reason_text(after)}
    with engine.begin() as conn:
        rows = conn.execute(_QUARANTINE_CRASH_LOOPS, params).all()
    return [Quarantine(r.id, r.worker_name, r.quarantine_fingerprint, r.quarantine_run_id, r.quarantine_reason)
            for r in rows]


class NotQuarantined(LookupError):
    """The schedule exists but is not quarantined: there is nothing to resume."""


def resume(engine: Engine, schedule_id: int, *, by: str | None = None) -> bool:
    """Lift a schedule's quarantine and enable it again; False when there is no such schedule.
    Raises ``NotQuarantined`` for a schedule that is not quarantined (nothing written)."""
    with engine.begin() as conn:
        resumed = conn.execute(_RESUME, {"id": schedule_id, "by": by}).one_or_none()
    if resumed is not None:
        return True
    if get_schedule(engine, schedule_id) is None:
        return False
    raise NotQuarantined(f"schedule {schedule_id} is not quarantined")
