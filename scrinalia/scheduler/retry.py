"""The retry policy (docs/operations.md, "Retry policy") as one statement.

Only SCHEDULE runs are retried; manual (API) and CLI runs never are. A retry is a new row created after
the previous row is terminal: attempt + 1, retry_of = the failed run, the same request, and
not_before = now() + 60 s x 2^(attempt-1) with +-20% jitter, capped at 30 minutes. At most three
attempts. CANCELLED is never retried, nor a failure on configuration (exit_reason ``configuration``: an
unknown worker, a request the resolver refuses, no model where the options say): it would fail the same
way, holding the slot through its backoff. Only a worker's *latest* run is considered, so a run that an
operator already re-ran by hand is not retried behind their back.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text

MAX_ATTEMPTS = 3
BASE_DELAY_S = 60
CAP_S = 30 * 60
JITTER = 0.20

# ON CONFLICT on the slot's partial unique index makes the retry race-free: if anything took the
# worker's slot meanwhile, the retry waits for the next tick instead of failing.
_RETRY_FAILED_SCHEDULED_RUNS = text(
    """
    INSERT INTO archive_worker_runs
        (worker_name, status, trigger, requested_by, request, attempt, retry_of, not_before, schedule_id)
    SELECT last.worker_name, 'QUEUED', 'SCHEDULE', 'scheduler (retry)', last.request, last.attempt + 1,
           last.run_id,
           now() + make_interval(secs => LEAST(:cap_s,
               :base_s * power(2, last.attempt - 1) * (1 - :jitter + random() * 2 * :jitter))),
           last.schedule_id
      FROM (SELECT DISTINCT worker_name FROM archive_worker_schedules) AS s
      CROSS JOIN LATERAL (
            SELECT r.* FROM archive_worker_runs r
             WHERE r.worker_name = s.worker_name
             ORDER BY r.id DESC
             LIMIT 1) AS last
     WHERE last.trigger = 'SCHEDULE'
       AND last.status IN ('FAILED', 'INTERRUPTED')
       AND last.exit_reason IS DISTINCT FROM 'configuration'
       AND last.attempt < :max_attempts
    ON CONFLICT (worker_name) WHERE status IN ('QUEUED', 'RUNNING') DO NOTHING
    RETURNING run_id, worker_name, attempt, retry_of
    """
)


@dataclass(frozen=True, slots=True)
class Retry:
    run_id: uuid.UUID
    worker_name: str
    attempt: int
    retry_of: uuid.UUID


def retry_failed_scheduled_runs(engine: Engine) -> list[Retry]:
    params = {"cap_s": CAP_S, "base_s": BASE_DELAY_S, "jitter": JITTER, "max_attempts": MAX_ATTEMPTS}
    with engine.begin() as conn:
        return [Retry(**r._mapping) for r in conn.execute(_RETRY_FAILED_SCHEDULED_RUNS, params).all()]
