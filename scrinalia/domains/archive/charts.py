"""What the panel's charts read, and the pruning of a run's samples: each one short statement.

* ``run_series``: a run's units/s and memory over its life, from ``archive_worker_run_samples`` (filled
  by the triggers of migration 0015, decision 0160), folded into at most ``points`` buckets;
* ``worker_trend``: a worker's finished runs per hour by outcome, and the p50/p95 duration of its
  successful runs, over 24 h or 7 d (``ix_worker_runs_worker_finished``, index-only);
* ``runner_slots``: a runner's average busy slots per bucket, from its runs' start and finish times
  (``ix_worker_runs_runner_finished`` and the RUNNING rows of ``ix_worker_runs_runner``);
* ``prune_samples``: the scheduler's bounded delete of the samples of runs older than the retention.

Every time comes from the database's clock. The windows end at ``now()`` and begin at the start of the
bucket ``span`` earlier, aligned to the bucket size from a fixed UTC origin, so two reads in the same
bucket see the same bars.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.types import Interval

from scrinalia.db.engine import one_statement

#: The default retention of the samples (RUN_SAMPLES_RETENTION_DAYS).
DEFAULT_SAMPLES_RETENTION_DAYS = 14
#: The most rows one prune deletes: the statement stays short whatever the backlog.
PRUNE_BATCH = 10_000
#: At most this many points in a run's series: enough for any chart width.
MAX_POINTS = 600
#: A bucket of a run's series is never shorter than this: a units/s between two samples a few
#: milliseconds apart (a heartbeat's right after a progress one) would be noise.
MIN_BUCKET_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Window:
    """A trend chart's span and bucket."""

    name: str
    span: timedelta
    step: timedelta


WINDOWS = {
    "24h": Window("24h", timedelta(hours=24), timedelta(hours=1)),
    "7d": Window("7d", timedelta(days=7), timedelta(hours=1)),
}
RUNNER_WINDOWS = {
    "24h": Window("24h", timedelta(hours=24), timedelta(minutes=10)),
    "7d": Window("7d", timedelta(days=7), timedelta(hours=1)),
}
OUTCOMES = ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED")

_ORIGIN = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
_SINCE = f"date_bin(:step, now(), {_ORIGIN}) - :span + :step"


# --- a run's series ------------------------------------------------------------------------------

_RUN_SERIES = text(
    """
    WITH s AS (
        -- one scan of the run's samples, its bounds from the same rows (no join for a plan to get wrong)
        SELECT at, done, total, rss_bytes, gpu_bytes,
               date_part('epoch', at - min(at) OVER ()) AS age,
               GREATEST(:min_bucket, date_part('epoch', max(at) OVER () - min(at) OVER ()) / :points) AS width
          FROM archive_worker_run_samples
         WHERE run_id = :run_id
    ), buckets AS (
        SELECT floor(age / width) AS b, max(at) AS at, max(done) AS done, max(total) AS total,
               max(rss_bytes) AS rss_bytes, max(gpu_bytes) AS gpu_bytes
          FROM s
         GROUP BY 1
    )
    SELECT date_part('epoch', at)::float8 AS epoch, done, total, rss_bytes, gpu_bytes,
           (done - lag(done) OVER w)::float8
             / NULLIF(date_part('epoch', at - lag(at) OVER w), 0)::float8 AS rate
      FROM buckets
    WINDOW w AS (ORDER BY b)
     ORDER BY b
    """
).bindparams(bindparam("run_id", type_=UUID(as_uuid=True)))


def run_series(engine: Engine | Connection, run_id: uuid.UUID, points: int = MAX_POINTS) -> list[dict[str, Any]]:
    """The run's samples folded into at most ``points`` buckets (the last time, the highest done and
    memory of each), with the units/s between consecutive buckets. Empty when the run has none."""
    with one_statement(engine) as conn:
        rows = conn.execute(_RUN_SERIES, {"run_id": run_id, "points": max(1, min(points, MAX_POINTS)),
                                          "min_bucket": MIN_BUCKET_SECONDS}).all()
    return [
        {"t": r.epoch, "done": r.done, "total": r.total, "rate": r.rate if r.rate is None or r.rate >= 0 else None,
         "rss_bytes": r.rss_bytes, "gpu_bytes": r.gpu_bytes}
        for r in rows
    ]


# --- a worker's trend ----------------------------------------------------------------------------

_WORKER_TREND = text(
    f"""
    WITH w AS (SELECT {_SINCE} AS since),
    agg AS (
        SELECT date_bin(:step, r.finished_at, {_ORIGIN}) AS bucket,
               count(*) FILTER (WHERE r.status = 'SUCCESS') AS success,
               count(*) FILTER (WHERE r.status = 'FAILED') AS failed,
               count(*) FILTER (WHERE r.status = 'INTERRUPTED') AS interrupted,
               count(*) FILTER (WHERE r.status = 'CANCELLED') AS cancelled,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY r.duration_ms) FILTER (WHERE r.status = 'SUCCESS') AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration_ms) FILTER (WHERE r.status = 'SUCCESS') AS p95
          FROM archive_worker_runs AS r
         WHERE r.worker_name = :worker
           AND r.finished_at IS NOT NULL
           AND r.finished_at >= {_SINCE}
         GROUP BY 1
    )
    SELECT date_part('epoch', b.bucket)::float8 AS epoch,
           COALESCE(agg.success, 0) AS success, COALESCE(agg.failed, 0) AS failed,
           COALESCE(agg.interrupted, 0) AS interrupted, COALESCE(agg.cancelled, 0) AS cancelled,
           agg.p50, agg.p95, w.since, now() AS until
      FROM w
     CROSS JOIN generate_series(w.since, now(), :step) AS b(bucket)
      LEFT JOIN agg ON agg.bucket = b.bucket
     ORDER BY b.bucket
    """
).bindparams(bindparam("step", type_=Interval()), bindparam("span", type_=Interval()))


@dataclass(frozen=True, slots=True)
class Trend:
    since: datetime
    until: datetime
    step_seconds: float
    buckets: list[dict[str, Any]]


def worker_trend(engine: Engine | Connection, worker: str, window: Window) -> Trend:
    """One bucket per ``window.step`` from ``since`` to now: finished runs by outcome (bucketed by when
    they finished) and the p50/p95 duration in ms of the successful ones (None where there were none)."""
    with one_statement(engine) as conn:
        rows = conn.execute(_WORKER_TREND, {"worker": worker, "step": window.step, "span": window.span}).all()
    buckets = [
        {"t": r.epoch, "success": r.success, "failed": r.failed, "interrupted": r.interrupted,
         "cancelled": r.cancelled, "p50_ms": r.p50, "p95_ms": r.p95}
        for r in rows
    ]
    return Trend(since=rows[0].since, until=rows[0].until, step_seconds=window.step.total_seconds(),
                 buckets=buckets)


# --- a runner's busy slots -----------------------------------------------------------------------

# A run holds one slot from its start to its finish: it opens one at its start and gives it back at its
# finish. So a bucket's busy seconds are (slots open at the bucket's start) * step, plus, for each start in
# the bucket, the seconds from it to the bucket's end, minus the same for each finish in it. One pass over
# the runs with two groupings (the starts by their bucket, the finishes by theirs: a few hundred groups),
# then a running sum over the buckets: no series per run, no interval arithmetic per run. A run
# begun before the window counts in the slots open at its start; times are seconds from ``since`` (float8,
# small numbers: exact enough whatever the number of runs per bucket).
_RUNNER_SLOTS = text(
    f"""
    WITH w AS (SELECT {_SINCE} AS since, date_part('epoch', {_SINCE}) AS since_s,
                      date_part('epoch', CAST(:step AS interval)) AS step_s),
    spans AS (
        SELECT r.started_at AS s, r.finished_at AS f
          FROM archive_worker_runs AS r
         WHERE r.runner_id = :runner_id AND r.finished_at IS NOT NULL
           AND r.finished_at >= {_SINCE} AND r.finished_at > r.started_at
        UNION ALL
        SELECT r.started_at, now()
          FROM archive_worker_runs AS r
         WHERE r.runner_id = :runner_id AND r.status = 'RUNNING' AND r.started_at < now()
    ),
    edges AS (
        SELECT date_bin(:step, sp.s, {_ORIGIN}) AS bs, date_bin(:step, sp.f, {_ORIGIN}) AS bf, count(*) AS n,
               sum(date_part('epoch', sp.s) - w.since_s) AS s, sum(date_part('epoch', sp.f) - w.since_s) AS f
          FROM spans AS sp CROSS JOIN w
         GROUP BY GROUPING SETS ((1), (2))
    ),
    buckets AS (
        -- each edge group as (bucket, slots opened, seconds held in its bucket), and every bucket of the
        -- window with none, so that each has a row
        SELECT bucket, sum(opened) AS opened, sum(held) AS held FROM (
            SELECT e.bs, e.n, e.n * (date_part('epoch', e.bs) - w.since_s + w.step_s) - e.s
              FROM edges AS e, w WHERE e.bs IS NOT NULL
            UNION ALL
            SELECT e.bf, -e.n, e.f - e.n * (date_part('epoch', e.bf) - w.since_s + w.step_s)
              FROM edges AS e, w WHERE e.bf IS NOT NULL
            UNION ALL
            SELECT b, 0, 0 FROM w, generate_series(w.since, now(), :step) AS b
        ) AS u(bucket, opened, held)
         GROUP BY bucket
    ),
    busy AS (
        SELECT bucket, held + w.step_s * COALESCE(sum(opened) OVER (ORDER BY bucket ROWS BETWEEN UNBOUNDED
                                                                    PRECEDING AND 1 PRECEDING), 0) AS seconds
          FROM buckets, w
    )
    SELECT date_part('epoch', busy.bucket)::float8 AS epoch, (busy.seconds / w.step_s)::float8 AS busy,
           (SELECT concurrency FROM archive_worker_runners WHERE runner_id = :runner_id) AS concurrency,
           w.since, now() AS until
      FROM busy, w
     WHERE busy.bucket >= w.since AND busy.bucket <= now()
     ORDER BY busy.bucket
    """
).bindparams(bindparam("runner_id", type_=UUID(as_uuid=True)), bindparam("step", type_=Interval()),
             bindparam("span", type_=Interval()))


def runner_slots(engine: Engine | Connection, runner_id: uuid.UUID, window: Window) -> tuple[Trend, int | None]:
    """The runner's average busy slots per bucket (a run busy for half of a bucket counts 0.5), and its
    concurrency (None: no such runner)."""
    with one_statement(engine) as conn:
        rows = conn.execute(_RUNNER_SLOTS, {"runner_id": runner_id, "step": window.step,
                                            "span": window.span}).all()
    buckets = [{"t": r.epoch, "busy": round(r.busy, 3)} for r in rows]
    trend = Trend(since=rows[0].since, until=rows[0].until, step_seconds=window.step.total_seconds(),
                  buckets=buckets)
    return trend, rows[0].concurrency


# --- retention -----------------------------------------------------------------------------------

# The samples of runs queued before the retention, by the time-ordered run id (its first 48 bits are the
# Unix ms of its enqueue, migration 0003): a range of the samples' own index, no index on ``at``. At most
# PRUNE_BATCH rows per statement, by ctid (a TID scan): a backlog takes several ticks, never a long one.
_PRUNE_SAMPLES = text(
    """
    DELETE FROM archive_worker_run_samples
     WHERE ctid = ANY (ARRAY(
           SELECT ctid FROM archive_worker_run_samples
            WHERE run_id < encode(substring(int8send((date_part('epoch', now() - make_interval(days => :days))
                                                     * 1000)::bigint) FROM 3)
                                  || '\\x00000000000000000000'::bytea, 'hex')::uuid
            LIMIT :batch))
    """
)


def prune_samples(engine: Engine, retention_days: int, batch: int = PRUNE_BATCH) -> int:
    """Delete up to ``batch`` samples of runs queued more than ``retention_days`` ago; returns how many."""
    if retention_days < 1:
        raise ValueError("the samples' retention is at least one day")
    with one_statement(engine) as conn:
        return conn.execute(_PRUNE_SAMPLES, {"days": int(retention_days), "batch": int(batch)}).rowcount
