"""The read side of the /system screens: one statement per concern, each backed by an index.

    workers   active+last run per worker (uq_worker_run_active, ix_worker_runs_worker_id), runners
              (registry, 100s of rows), running runs per runner (ix_worker_runs_runner), settings,
              unit counts (archive_stamp_counts, kept by triggers), the database clock and revision
    runs      keyset on id, filters on worker / status / fingerprint / trigger (ix_worker_runs_*_id)
    failures  errors of the last N days grouped by fingerprint (ix_worker_runs_failures)
"""
from __future__ import annotations

import re
import uuid
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import UUID

from scrinalia import __version__
from scrinalia.api import catalogue_view
from scrinalia.db import migrate
from scrinalia.db.engine import one_statement
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import RUN_COLUMNS, WorkerRun
from scrinalia.domains.archive.worker_settings import all_settings
from scrinalia.domains.archive.workers.sdk import WorkerSpec

_SECRETISH = re.compile(r"(pass(word)?|secret|token|api[_-]?key|credential|private[_-]?key|dsn|database_url)", re.I)
REDACTED = "***"


def redact(value: Any) -> Any:
    """Mask values under secret-looking keys in JSON that a worker or an operator wrote (options, config)."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and _SECRETISH.search(k) and v not in (None, "") else redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def run_json(run: WorkerRun | dict[str, Any] | None) -> dict[str, Any] | None:
    """A run as the API shows it (the ledger's JSON, secret-looking option values masked)."""
    if run is None:
        return None
    data = run.to_json() if isinstance(run, WorkerRun) else dict(run)
    for key in ("request", "config", "options", "result"):
        if data.get(key) is not None:
            data[key] = redact(data[key])
    return data


_RUN_FIELDS = tuple(RUN_COLUMNS.split(", "))


def _normalise_jsonb_run(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """``to_jsonb(row)`` of a run (from active_and_last_runs) cut down to the WorkerRun fields."""
    if raw is None:
        return None
    return run_json({name: raw.get(name) for name in _RUN_FIELDS})


_CLOCK = text(
    "SELECT now() AS db_now, "
    "CASE WHEN to_regclass('alembic_version') IS NOT NULL "
    "THEN (SELECT version_num FROM alembic_version LIMIT 1) END AS revision"
)

_RUNNING_PER_RUNNER = text(
    "SELECT runner_id, count(*) AS n FROM archive_worker_runs WHERE status = 'RUNNING' AND runner_id IS NOT NULL "
    "GROUP BY runner_id"
)


def db_clock(engine: Engine | Connection) -> tuple[datetime, str | None]:
    with one_statement(engine) as conn:
        row = conn.execute(_CLOCK).one()
    return row.db_now, row.revision


def runners_view(engine: Engine | Connection, *, stopped_within_hours: int = 24, db_revision: str | None = None,
                 with_clock: bool = True) -> list[dict[str, Any]]:
    rows = registry.list_runners(engine, stopped_within_hours=stopped_within_hours)
    with one_statement(engine) as conn:
        running = {r.runner_id: int(r.n) for r in conn.execute(_RUNNING_PER_RUNNER).all()}
    if with_clock and db_revision is None:
        _, db_revision = db_clock(engine)
    version = __version__
    out = []
    for row in rows:
        # fields, not dataclasses.asdict: asdict deep-copies every row's devices and children (most of
        # the route's time with 100 runners); each row is fresh from its query, nobody else holds it
        data = {f.name: _iso(getattr(row, f.name)) for f in fields(row)}
        data["runner_id"] = str(row.runner_id)
        data["running"] = running.get(row.runner_id, 0)
        data["busy"] = data["running"] >= row.concurrency
        data["schema_mismatch"] = db_revision is not None and row.schema_revision != db_revision
        data["version_mismatch"] = row.package_version != version
        out.append(data)
    return out


def _capable(runners: list[dict[str, Any]], worker: str) -> list[dict[str, Any]]:
    """The online runners that advertise ``worker``."""
    return [r for r in runners if r["state"] == "online" and worker in r["capabilities"]]


def _device_slots(runner: dict[str, Any]) -> tuple[int, int] | None:
    """(busy, total) device slots of a runner that owns devices (its registry ``devices`` carry
    ``slots``; its children their ``device``), or None for a runner without a device rule."""
    owned = [d for d in runner.get("devices") or [] if isinstance(d, dict) and d.get("slots")]
    if not owned:
        return None
    busy = sum(1 for c in runner.get("children") or [] if isinstance(c, dict) and c.get("device"))
    return busy, sum(int(d["slots"]) for d in owned)


def _fits_no_device(runner: dict[str, Any], need_bytes: int) -> bool:
    """Every owned device of ``runner`` has less memory in all than ``need_bytes``."""
    owned = [d for d in runner.get("devices") or [] if isinstance(d, dict) and d.get("slots")]
    totals = [d.get("memory_total_bytes") for d in owned]
    return bool(owned) and all(isinstance(t, int) and t < need_bytes for t in totals)


def _device_reason(spec: WorkerSpec | None, free: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a GPU worker: the free runners (a slot of --concurrency left) all lack a free device slot,
    or none of their devices is large enough for the memory the worker declares."""
    if spec is None or not spec.gpu or not free:
        return None
    need = spec.gpu_memory_needed()
    if need and all(_fits_no_device(r, need) for r in free):
        return {"code": "no_device_fits",
                "message": f"the worker declares {need / 2**30:.1f} GiB of GPU memory, more than any device of "
                           "the capable runners has", "not_before": None}
    slots = [_device_slots(r) for r in free]
    if all(s is not None and s[0] >= s[1] for s in slots):
        busy = sum(s[0] for s in slots if s)
        total = sum(s[1] for s in slots if s)
        return {"code": "waiting_for_device",
                "message": f"waiting for a free GPU: every device slot of the capable runners is taken "
                           f"({busy} of {total}); it starts when a device is free", "not_before": None}
    return None


def queued_reason(run: dict[str, Any], worker: str, capable: list[dict[str, Any]], db_now: datetime,
                  db_revision: str | None, spec: WorkerSpec | None = None) -> dict[str, Any]:
    """Why a QUEUED run is not running yet, in the order an operator would check.
    ``capable``: the online runners that advertise the worker (``_capable``); ``spec``: the worker's
    declaration (a GPU worker waits for a device slot on a runner that owns devices)."""
    not_before = run.get("not_before")
    if not_before is not None and datetime.fromisoformat(not_before) > db_now:
        return {"code": "backing_off", "message": f"retry attempt {run.get('attempt')} waits until {not_before}",
                "not_before": not_before}
    if not capable:
        return {"code": "no_runner", "message": f"no online runner advertises the worker {worker!r}", "not_before": None}
    accepting = [r for r in capable if r["drain_requested_at"] is None]
    if not accepting:
        return {"code": "draining", "message": "every capable runner is draining", "not_before": None}
    current = [r for r in accepting if not r["schema_mismatch"]]
    if not current:
        return {"code": "schema_behind",
                "message": f"every capable runner was built for another schema revision than the database's ({db_revision})",
                "not_before": None}
    if all(r["busy"] for r in current):
        return {"code": "runners_busy", "message": "every capable runner is busy with other runs", "not_before": None}
    device = _device_reason(spec, [r for r in current if not r["busy"]])
    if device is not None:
        return device
    return {"code": "waiting_for_claim", "message": "a capable runner is free; it claims the run at its next poll",
            "not_before": None}


def _runner_summary(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("runner_id", "name", "hostname", "state", "running", "concurrency", "busy", "schema_mismatch",
            "drain_requested_at", "package_version")
    return {k: r[k] for k in keys}


def workers_view(engine: Engine, catalogue: dict[str, WorkerSpec], names: list[str] | None = None,
                 counts_cache: catalogue_view.CountsCache | None = None) -> dict[str, Any]:
    specs = {n: catalogue[n] for n in (names if names is not None else catalogue)}
    # Every read on ONE pooled connection in autocommit: each read is one statement (its own snapshot,
    # as before), and the screen pays one checkout and pre-ping instead of one per read, and no
    # BEGIN/ROLLBACK pairs (issue 14: the route's time was mostly round trips once the counts were cheap).
    with one_statement(engine) as conn:
        db_now, db_revision = db_clock(conn)
        runners = runners_view(conn, db_revision=db_revision, with_clock=False)
        active_last = ledger.active_and_last_runs(conn, list(specs))
        persisted = all_settings(conn)
        layer = catalogue_view.database_layer(conn, specs, persisted)
        if counts_cache is not None:
            counts, counts_as_of = counts_cache.get(engine, catalogue, list(specs), conn=conn)
        else:
            counts, counts_as_of = catalogue_view.unit_counts(engine, specs, conn=conn), db_now
    workers = []
    for name, spec in specs.items():
        active_raw, last_raw = active_last.get(name, (None, None))
        active = _normalise_jsonb_run(active_raw)
        capable = _capable(runners, name)
        workers.append({
            **catalogue_view.describe(spec),
            "settings": {
                "persisted": redact(persisted.get(name)),
                "effective": redact(catalogue_view.effective_settings(spec, engine, layer)),
            },
            "counts": counts.get(name, {"pending": None, "processed": None, "failed": None}),
            "active_run": active,
            "last_run": _normalise_jsonb_run(last_raw),
            "runners": [_runner_summary(r) for r in capable],
            "queued_reason": (queued_reason(active, name, capable, db_now, db_revision, spec)
                              if active is not None and active["status"] == "QUEUED" else None),
        })
    return {
        "db_now": db_now.isoformat(),
        "schema_revision": db_revision,
        "runners_online": sum(1 for r in runners if r["state"] == "online"),
        "counts_as_of": counts_as_of.isoformat() if counts_as_of else None,
        "workers": workers,
    }


# --- runs -----------------------------------------------------------------------------------------


def list_runs(
    engine: Engine,
    *,
    worker: str | None = None,
    statuses: list[str] | None = None,
    fingerprint: str | None = None,
    trigger: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset on id: the next page starts strictly below the last id returned."""
    where, params = [], {"limit": limit + 1}
    if worker is not None:
        where.append("worker_name = :worker")
        params["worker"] = worker
    if statuses:
        where.append("status = ANY(CAST(:statuses AS worker_run_status[]))")
        params["statuses"] = statuses
    if fingerprint is not None:
        where.append("error_fingerprint = :fingerprint")
        params["fingerprint"] = fingerprint
    if trigger is not None:
        where.append("trigger = CAST(:trigger AS worker_run_trigger)")
        params["trigger"] = trigger
    if before_id is not None:
        where.append("id < :before_id")
        params["before_id"] = before_id
    sql = f"SELECT {RUN_COLUMNS} FROM archive_worker_runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC LIMIT :limit"
    with engine.connect() as conn:
        rows = conn.execute(text(sql), params).all()
    runs = [WorkerRun.from_row(r) for r in rows[:limit]]
    next_cursor = str(runs[-1].id) if len(rows) > limit and runs else None
    return [run_json(r) for r in runs], next_cursor


_CHAIN = text(
    """
    WITH RECURSIVE up AS (
        SELECT run_id, retry_of, 0 AS depth FROM archive_worker_runs WHERE run_id = :run_id
        UNION ALL
        SELECT r.run_id, r.retry_of, up.depth + 1 FROM archive_worker_runs r JOIN up ON r.run_id = up.retry_of
         WHERE up.depth < 50
    ), root AS (
        SELECT run_id FROM up ORDER BY depth DESC LIMIT 1
    ), down AS (
        SELECT r.run_id, 0 AS depth FROM archive_worker_runs r WHERE r.run_id = (SELECT run_id FROM root)
        UNION ALL
        SELECT r.run_id, down.depth + 1 FROM archive_worker_runs r JOIN down ON r.retry_of = down.run_id
         WHERE down.depth < 50
    )
    SELECT r.run_id, r.attempt, r.status, r.trigger, r.queued_at, r.started_at, r.finished_at, r.not_before,
           r.retry_of, r.error, r.error_fingerprint, r.exit_reason
      FROM down JOIN archive_worker_runs r ON r.run_id = down.run_id
     ORDER BY down.depth, r.id
    """
).bindparams(bindparam("run_id", type_=UUID(as_uuid=True)))


def run_detail(engine: Engine, run_id: uuid.UUID) -> dict[str, Any] | None:
    run = ledger.get_run(engine, run_id)
    if run is None:
        return None
    with engine.connect() as conn:
        chain = conn.execute(_CHAIN, {"run_id": run_id}).all()
    data = run_json(run)
    data["attempts"] = [
        {k: (str(v) if isinstance(v, uuid.UUID) else _iso(v)) for k, v in row._mapping.items()} for row in chain
    ]
    runner = registry.get_runner(engine, run.runner_id) if run.runner_id else None
    data["runner"] = (
        {"runner_id": str(runner.runner_id), "name": runner.name, "hostname": runner.hostname, "state": runner.state}
        if runner else None
    )
    return data


# --- failures -------------------------------------------------------------------------------------

_FAILURES = text(
    """
    SELECT error_fingerprint AS fingerprint,
           count(*) AS occurrences,
           min(finished_at) AS first_seen,
           max(finished_at) AS last_seen,
           array_agg(DISTINCT worker_name ORDER BY worker_name) AS workers,
           (array_agg(error ORDER BY finished_at DESC, id DESC))[1] AS sample_error,
           (array_agg(run_id ORDER BY finished_at DESC, id DESC))[1] AS sample_run_id,
           array_agg(DISTINCT status::text ORDER BY status::text) AS statuses
      FROM archive_worker_runs
     WHERE error_fingerprint IS NOT NULL
       AND finished_at >= now() - make_interval(days => :days)
       AND (CAST(:worker AS text) IS NULL OR worker_name = :worker)
     GROUP BY error_fingerprint
     ORDER BY max(finished_at) DESC
     LIMIT :limit
    """
)


def failures(engine: Engine, *, days: int, worker: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(_FAILURES, {"days": days, "worker": worker, "limit": limit}).all()
    return [
        {k: (str(v) if isinstance(v, uuid.UUID) else _iso(v)) for k, v in r._mapping.items()} for r in rows
    ]


# --- metrics --------------------------------------------------------------------------------------

_METRICS_ACTIVE = text(
    "SELECT worker_name, status::text AS status, count(*) AS n, "
    "max(extract(epoch FROM now() - queued_at)) FILTER (WHERE status = 'QUEUED') AS oldest "
    "FROM archive_worker_runs WHERE status IN ('QUEUED', 'RUNNING') GROUP BY worker_name, status"
)
_METRICS_FAILURES = text(
    "SELECT worker_name, count(*) AS n FROM archive_worker_runs "
    "WHERE error_fingerprint IS NOT NULL AND finished_at >= now() - interval '24 hours' GROUP BY worker_name"
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_text(engine: Engine, catalogue: dict[str, WorkerSpec],
                 counts_cache: catalogue_view.CountsCache | None = None) -> str:
    """Prometheus text format, computed from the database only, so every API process answers the same."""
    with engine.connect() as conn:
        active = conn.execute(_METRICS_ACTIVE).all()
        failed = conn.execute(_METRICS_FAILURES).all()
    runners = runners_view(engine)
    counts = (counts_cache.get(engine, catalogue)[0] if counts_cache is not None
              else catalogue_view.unit_counts(engine, catalogue))
    lines = [
        "# HELP scrinalia_build_info The API's package version and the schema head it was built for.",
        "# TYPE scrinalia_build_info gauge",
        f'scrinalia_build_info{{version="{_label(__version__)}",schema_head="{_label(migrate.head_revision())}"}} 1',
        "# HELP scrinalia_worker_runs_active Active runs (QUEUED or RUNNING) per worker.",
        "# TYPE scrinalia_worker_runs_active gauge",
    ]
    by = {(r.worker_name, r.status): r for r in active}
    for name in sorted(set(catalogue) | {w for w, _ in by}):
        for status in ("QUEUED", "RUNNING"):
            row = by.get((name, status))
            lines.append(f'scrinalia_worker_runs_active{{worker="{_label(name)}",status="{status}"}} {row.n if row else 0}')
    lines += ["# HELP scrinalia_worker_queued_age_seconds Age of the QUEUED run per worker.",
              "# TYPE scrinalia_worker_queued_age_seconds gauge"]
    for (name, status), row in sorted(by.items()):
        if status == "QUEUED" and row.oldest is not None:
            lines.append(f'scrinalia_worker_queued_age_seconds{{worker="{_label(name)}"}} {float(row.oldest):.3f}')
    lines += ["# HELP scrinalia_worker_failures_24h Runs that ended with an error in the last 24 hours.",
              "# TYPE scrinalia_worker_failures_24h gauge"]
    for row in failed:
        lines.append(f'scrinalia_worker_failures_24h{{worker="{_label(row.worker_name)}"}} {row.n}')
    lines += ["# HELP scrinalia_worker_units Units per worker: pending, processed, failed.",
              "# TYPE scrinalia_worker_units gauge"]
    for name, c in counts.items():
        for kind in ("pending", "processed", "failed"):
            if c.get(kind) is not None:
                lines.append(f'scrinalia_worker_units{{worker="{_label(name)}",kind="{kind}"}} {c[kind]}')
    lines += ["# HELP scrinalia_runners Runners in the registry by state.", "# TYPE scrinalia_runners gauge"]
    for state in ("online", "stale", "stopped"):
        lines.append(f'scrinalia_runners{{state="{state}"}} {sum(1 for r in runners if r["state"] == state)}')
    lines += ["# HELP scrinalia_runner_running_runs Runs each live runner holds.",
              "# TYPE scrinalia_runner_running_runs gauge"]
    for r in runners:
        if r["state"] != "stopped":
            lines.append(
                f'scrinalia_runner_running_runs{{runner="{_label(r["name"])}",runner_id="{r["runner_id"]}"}} {r["running"]}'
            )
    return "\n".join(lines) + "\n"
