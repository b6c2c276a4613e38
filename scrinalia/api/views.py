"""The read side of the /system screens: one statement per concern, each backed by an index.

    workers   active+last run per worker (uq_worker_run_active, ix_worker_runs_worker_id), runners
              (registry, 100s of rows), running runs per runner (ix_worker_runs_runner), settings,
              unit counts (catalogue_view.unit_counts: each queue read through its partial indexes), the
              database clock and revision
    runs      keyset on id, filters on worker / status / fingerprint / trigger (ix_worker_runs_*_id)
    failures  errors of the last N days grouped by fingerprint (ix_worker_runs_failures)
"""
from __future__ import annotations

import re
import uuid
from dataclasses import fields
from datetime import datetime
from typing import Any, overload

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import UUID

from scrinalia import __version__
from scrinalia.api import catalogue_view
from scrinalia.db import xmin_horizon
from scrinalia.db.engine import one_statement
from scrinalia.db.tables import ACTIVE_PREDICATE, ACTIVE_STATUSES, RARE_ENDING_PREDICATE, RARE_ENDINGS
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import RUN_COLUMNS, WorkerRun
from scrinalia.domains.archive.worker_settings import all_settings
from scrinalia.domains.archive.workers.sdk import WorkerSpec
from scrinalia.scheduler.schedules import Schedule, quarantined_schedules

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


@overload
def run_json(run: WorkerRun | dict[str, Any]) -> dict[str, Any]: ...


@overload
def run_json(run: None) -> None: ...


def run_json(run: WorkerRun | dict[str, Any] | None) -> dict[str, Any] | None:
    """A run as the API shows it (the ledger's JSON, secret-looking option values masked, the error as
    its cause in words: ``error_in_words``)."""
    if run is None:
        return None
    data = run.to_json() if isinstance(run, WorkerRun) else dict(run)
    for key in ("request", "config", "options", "result"):
        if data.get(key) is not None:
            data[key] = redact(data[key])
    if "error" in data:
        data["error"] = error_in_words(data["error"])
    return data


# A path as the ledger's fingerprint finds one (migration 0001, ``archive_error_fingerprint``).
_PATH = re.compile(r"(^|[\s'\"(=:,\[])(~?/[^\s'\"(),:\]]+)")


def error_in_words(error: str | None) -> str | None:
    """What every role sees of a run's error: its first line (``ExceptionClass: message``, the cause in
    the words of whoever raised it), each server path cut to its last name (``…/ner-model``). The
    traceback and the child's output tail after it stay in the ledger and in the runner's log, where the
    operator reads them (``scrinalia runs show RUN --json``, the runner's journal); no page shows a server's files."""
    if error is None:
        return None
    first = error.strip().split("\n", 1)[0]
    return _PATH.sub(lambda m: f"{m.group(1)}…/{m.group(2).rstrip('/').rsplit('/', 1)[-1]}", first)


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


def xmin_horizon_view(engine: Engine | Connection) -> dict[str, Any] | None:
    """The oldest holder of the xmin horizon (decision 0371), or None."""
    with one_statement(engine) as conn:
        holder = xmin_horizon.oldest_xmin(conn)
    return holder.to_json() if holder is not None else None


def _capable(runners: list[dict[str, Any]], worker: str) -> list[dict[str, Any]]:
    """The online runners that advertise ``worker``."""
    return [r for r in runners if r["state"] == "online" and worker in r["capabilities"]]


def _why(code: str, message: str, not_before: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "not_before": not_before}


def _owned_devices(runner: dict[str, Any]) -> list[dict[str, Any]]:
    """The devices of a runner with a device rule (its registry ``devices`` carry ``slots``)."""
    return [d for d in runner.get("devices") or [] if isinstance(d, dict) and d.get("slots")]


def _device_slots(runner: dict[str, Any]) -> tuple[int, int] | None:
    """(busy, total) device slots of a runner that owns devices (its children carry their ``device``),
    or None for a runner without a device rule."""
    owned = _owned_devices(runner)
    if not owned:
        return None
    busy = sum(1 for c in runner.get("children") or [] if isinstance(c, dict) and c.get("device"))
    return busy, sum(int(d["slots"]) for d in owned)


def _fits_no_device(runner: dict[str, Any], need_bytes: int) -> bool:
    """Every owned device of ``runner`` has less memory in all than ``need_bytes``."""
    owned = _owned_devices(runner)
    totals = [d.get("memory_total_bytes") for d in owned]
    return bool(owned) and all(isinstance(t, int) and t < need_bytes for t in totals)


def _device_reason(spec: WorkerSpec | None, free: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a GPU worker: the free runners (a slot of --concurrency left) all lack a free device slot,
    or none of their devices is large enough for the memory the worker declares."""
    if spec is None or not spec.gpu or not free:
        return None
    need = spec.gpu_memory_needed()
    if need and all(_fits_no_device(r, need) for r in free):
        return _why("no_device_fits", f"the worker declares {need / 2**30:.1f} GiB of GPU memory, more than any "
                                      "device of the capable runners has")
    return _waiting_for_device([_device_slots(r) for r in free])


def _waiting_for_device(slots: list[tuple[int, int] | None]) -> dict[str, Any] | None:
    """Every free runner owns devices and every slot of them is taken."""
    taken = [s for s in slots if s is not None and s[0] >= s[1]]
    if len(taken) < len(slots):
        return None
    busy, total = sum(s[0] for s in taken), sum(s[1] for s in taken)
    return _why("waiting_for_device", f"waiting for a free GPU: every device slot of the capable runners is "
                                      f"taken ({busy} of {total}); it starts when a device is free")


def _runner_reason(worker: str, capable: list[dict[str, Any]], db_revision: str | None) -> dict[str, Any] | None:
    """No capable runner can claim now: none online, all draining, all behind the schema, all busy."""
    if not capable:
        return _why("no_runner", f"no online runner advertises the worker {worker!r}")
    accepting = [r for r in capable if r["drain_requested_at"] is None]
    if not accepting:
        return _why("draining", "every capable runner is draining")
    current = [r for r in accepting if not r["schema_mismatch"]]
    if not current:
        return _why("schema_behind", "every capable runner was built for another schema revision than the "
                                     f"database's ({db_revision})")
    if all(r["busy"] for r in current):
        return _why("runners_busy", "every capable runner is busy with other runs")
    return None


def queued_reason(run: dict[str, Any], worker: str, capable: list[dict[str, Any]], db_now: datetime,
                  db_revision: str | None, spec: WorkerSpec | None = None) -> dict[str, Any]:
    """Why a QUEUED run is not running yet, in the order an operator would check.
    ``capable``: the online runners that advertise the worker (``_capable``); ``spec``: the worker's
    declaration (a GPU worker waits for a device slot on a runner that owns devices)."""
    not_before = run.get("not_before")
    if not_before is not None and datetime.fromisoformat(not_before) > db_now:
        return _why("backing_off", f"retry attempt {run.get('attempt')} waits until {not_before}", not_before)
    free = [r for r in capable if r["drain_requested_at"] is None and not r["schema_mismatch"] and not r["busy"]]
    return (_runner_reason(worker, capable, db_revision) or _device_reason(spec, free)
            or _why("waiting_for_claim", "a capable runner is free; it claims the run at its next poll"))


def _queued_reason_of(active: dict[str, Any] | None, worker: str, capable: list[dict[str, Any]], db_now: datetime,
                      db_revision: str | None, spec: WorkerSpec) -> dict[str, Any] | None:
    if active is None or active["status"] != "QUEUED":
        return None
    return queued_reason(active, worker, capable, db_now, db_revision, spec)


def _runner_summary(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("runner_id", "name", "hostname", "state", "running", "concurrency", "busy", "schema_mismatch",
            "drain_requested_at", "package_version")
    return {k: r[k] for k in keys}


def quarantine_json(schedule: Schedule) -> dict[str, Any] | None:
    """A schedule's crash-loop quarantine as the API shows it (None when it is not quarantined)."""
    if not schedule.quarantined or schedule.quarantined_at is None:
        return None
    return {"schedule_id": schedule.id, "quarantined_at": schedule.quarantined_at.isoformat(),
            "reason": schedule.quarantine_reason, "fingerprint": schedule.quarantine_fingerprint,
            "run_id": str(schedule.quarantine_run_id) if schedule.quarantine_run_id is not None else None}


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
        quarantined = {q.worker_name: q for q in quarantined_schedules(conn)}
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
            "queued_reason": _queued_reason_of(active, name, capable, db_now, db_revision, spec),
            "quarantine": quarantine_json(quarantined[name]) if name in quarantined else None,
        })
    return {
        "db_now": db_now.isoformat(),
        "schema_revision": db_revision,
        "runners_online": sum(1 for r in runners if r["state"] == "online"),
        "counts_as_of": counts_as_of.isoformat() if counts_as_of else None,
        "workers": workers,
    }


# --- runs -----------------------------------------------------------------------------------------


#: The runs list's filters: the parameter each one binds, and its condition.
_RUN_FILTERS = {
    "worker": "worker_name = :worker",
    "statuses": "status = ANY(CAST(:statuses AS worker_run_status[]))",
    "fingerprint": "error_fingerprint = :fingerprint",
    "trigger": "trigger = CAST(:trigger AS worker_run_trigger)",
    "before_id": "id < :before_id",
}


def _status_hint(statuses: list[str] | None) -> list[str]:
    """A literal restatement of a status filter that lies within one partial index's predicate, so that
    even a generic plan (a prepared statement's, which cannot see ``:statuses``) may read that index: the
    active rows are ``uq_worker_run_active``'s, the rare endings ``ix_worker_runs_ending_id``'s (decision
    0391). Built from constants only; it changes no answer."""
    for group, predicate in ((ACTIVE_STATUSES, ACTIVE_PREDICATE), (RARE_ENDINGS, RARE_ENDING_PREDICATE)):
        if statuses and set(statuses) <= set(group):
            return [predicate]
    return []


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
    filters = {"worker": worker, "statuses": statuses or None, "fingerprint": fingerprint, "trigger": trigger,
               "before_id": before_id}
    params: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
    where = [_RUN_FILTERS[k] for k in params] + _status_hint(statuses)
    params["limit"] = limit + 1
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
        {k: (str(v) if isinstance(v, uuid.UUID) else error_in_words(v) if k == "error" else _iso(v))
         for k, v in row._mapping.items()} for row in chain
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
        {k: (str(v) if isinstance(v, uuid.UUID) else error_in_words(v) if k == "sample_error" else _iso(v))
         for k, v in r._mapping.items()} for r in rows
    ]
