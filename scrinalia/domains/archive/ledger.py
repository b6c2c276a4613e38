"""The ledger is the queue: every protocol step on ``archive_worker_runs`` as ONE SQL statement.

Each function runs exactly one statement in its own transaction (sent in autocommit through
``one_statement``: one round trip, no BEGIN/COMMIT pair around it), takes every timestamp from the
database's ``now()`` (the API host and the GPU host have different clocks), and carries a fence. The
statements themselves live in one file, ``queries.sql``, each under its name with its fence (read once by
``scrinalia.domains.archive.queries``; docs/protocol.md lists them); this module binds their parameters.
A step with more than a few fields takes one parameter object (``FinishParams``, ``StartParams``), the
same on the ledger port and both of its adapters.

A fenced statement that touches no row means the caller lost that run: it must write nothing more.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from psycopg.errors import UniqueViolation
from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import Text

from scrinalia.db.engine import one_statement
from scrinalia.db.tables import (
    ERROR_MAX,
    EXIT_REASONS,
    RUN_TRIGGERS,
    TERMINAL_STATUSES,
    WORKER_NAME_MAX,
)
from scrinalia.domains.archive.errors import (
    InvalidRunRequest,
    RunAlreadyFinished,
    RunNotFound,
    WorkerRunAlreadyActive,
)
from scrinalia.domains.archive.queries import QUERIES

REQUEST_KEYS = ("engine_name", "preset", "db_batch_size", "options", "engine_options")
BATCH_SIZE_MIN, BATCH_SIZE_MAX = 1, 10_000


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """One ledger row. Plain data, so it crosses process boundaries (pickle, JSON) unchanged."""

    id: int
    run_id: uuid.UUID
    worker_name: str
    status: str
    trigger: str
    requested_by: str | None
    requested_by_user_id: int | None
    request: dict[str, Any]
    engine_name: str | None
    preset: str | None
    config: dict[str, Any] | None
    options: dict[str, Any] | None
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_ms: int | None
    runner_id: uuid.UUID | None
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    attempt: int
    retry_of: uuid.UUID | None
    not_before: datetime | None
    schedule_id: int | None
    cancel_requested_at: datetime | None
    cancel_requested_by: str | None
    error: str | None
    error_fingerprint: str | None
    exit_code: int | None
    exit_signal: int | None
    exit_reason: str | None
    progress: dict[str, Any] | None
    metrics: dict[str, Any] | None
    result: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: Any) -> WorkerRun:
        m = row._mapping
        return cls(**{f.name: m[f.name] for f in fields(cls)})

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (uuids and datetimes as strings)."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, uuid.UUID):
                out[key] = str(value)
            elif isinstance(value, datetime):
                out[key] = value.isoformat()
        return out


#: A run's configuration and options: in its own row when the previous release's ``record_start`` wrote
#: them there, else in ``archive_worker_run_configs`` (decision 0394). Every reader sees one column each.
#: The run's row first: a row the runner role could add there never overrides a finished run's record.
_RECORDED_COLUMNS = ("config", "options")
_RECORDED = ("COALESCE(archive_worker_runs.{c}, (SELECT rc.{c} FROM archive_worker_run_configs AS rc "
             "WHERE rc.run_id = archive_worker_runs.run_id)) AS {c}")
#: The WorkerRun columns of a statement on ``archive_worker_runs`` (unaliased: a SELECT or a RETURNING).
RUN_COLUMNS = ", ".join(_RECORDED.format(c=f.name) if f.name in _RECORDED_COLUMNS else f.name
                        for f in fields(WorkerRun))


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """What one batched heartbeat learned.

    ``held`` maps every run this runner still holds to its ``cancel_requested_at`` (None when no
    cancellation was asked). A run the caller believed it held but that is absent here has been lost.
    """

    registry_renewed: bool
    held: dict[uuid.UUID, datetime | None]
    drain_requested_at: datetime | None
    db_now: datetime
    lease_expires_at: datetime


# --- validation ----------------------------------------------------------------------------------


def validate_worker_name(worker_name: Any) -> str:
    if not isinstance(worker_name, str) or not worker_name.strip():
        raise InvalidRunRequest("worker_name", "must be a non-empty string")
    if len(worker_name) > WORKER_NAME_MAX:
        raise InvalidRunRequest("worker_name", f"must be at most {WORKER_NAME_MAX} characters")
    return worker_name


class ValidRequest(dict[str, Any]):
    """A request whose shape ``validate_request`` passed. The steps after it in the same entry point (the
    resolver, ``enqueue``, ``create_running``) take it as it is, so each entry point checks a request once
    (decision 0135). What the database gives back is a plain dict: the claim checks it anew, its own entry."""


def validate_request(request: Any) -> ValidRequest:
    """The request's shape (the catalogue validates engines, presets and options against the worker);
    a ``ValidRequest`` is returned as it is: this entry point has checked it already."""
    if isinstance(request, ValidRequest):
        return request
    return check_request_shape(request)


def check_request_shape(request: Any) -> ValidRequest:
    """The one check of a request's shape, whoever asks (``validate_request``): an object of the known
    fields, each set one of its kind (``_FIELD_PROBLEMS``, in ``REQUEST_KEYS``' order), and JSON as a whole."""
    if not isinstance(request, Mapping):
        raise InvalidRunRequest("request", f"must be an object, not {type(request).__name__}")
    unknown = sorted(set(request) - set(REQUEST_KEYS))
    if unknown:
        raise InvalidRunRequest(unknown[0], f"is not a request field (expected one of {', '.join(REQUEST_KEYS)})")
    clean = ValidRequest(request)
    for key, problem_of in _FIELD_PROBLEMS.items():
        problem = problem_of(clean[key]) if clean.get(key) is not None else None
        if problem is not None:
            raise InvalidRunRequest(key, problem)
    try:
        json.dumps(clean)
    except (TypeError, ValueError) as exc:
        raise InvalidRunRequest("request", f"must be JSON-serialisable ({exc})") from None
    return clean


def _name_problem(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string or null"


def _batch_size_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if not BATCH_SIZE_MIN <= value <= BATCH_SIZE_MAX:
        return f"must be between {BATCH_SIZE_MIN} and {BATCH_SIZE_MAX}, got {value}"
    return None


def _object_problem(value: Any) -> str | None:
    return None if isinstance(value, Mapping) else "must be an object"


#: What is wrong with a request field's (non-null) value, or None; one entry per ``REQUEST_KEYS``.
_FIELD_PROBLEMS: dict[str, Callable[[Any], str | None]] = {
    "engine_name": _name_problem,
    "preset": _name_problem,
    "db_batch_size": _batch_size_problem,
    "options": _object_problem,
    "engine_options": _object_problem,
}


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


# --- enqueue -------------------------------------------------------------------------------------

#: The two uuid parameters of the fenced statements of a run.
_RUN_AND_RUNNER = (bindparam("run_id", type_=UUID(as_uuid=True)), bindparam("runner_id", type_=UUID(as_uuid=True)))

_ENQUEUE = QUERIES["enqueue"].text(run_columns=RUN_COLUMNS).bindparams(
    bindparam("retry_of", type_=UUID(as_uuid=True)))


def check_enqueue(worker_name: Any, request: Any, *, trigger: str, attempt: Any) -> dict[str, Any]:
    """What ``enqueue`` refuses before it sends anything (``InvalidRunRequest``); the clean request.
    The in-memory ledger (``runner.memory_ledger``) refuses the same with this same function."""
    validate_worker_name(worker_name)
    clean = validate_request(request)
    if trigger not in RUN_TRIGGERS:
        raise InvalidRunRequest("trigger", f"must be one of {', '.join(RUN_TRIGGERS)}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidRunRequest("attempt", "must be a positive integer")
    return clean


def enqueue(
    engine: Engine,
    worker_name: str,
    request: Mapping[str, Any],
    *,
    trigger: str = "API",
    requested_by: str | None = None,
    requested_by_user_id: int | None = None,
    attempt: int = 1,
    retry_of: uuid.UUID | None = None,
    not_before_delay_s: float | None = None,
    schedule_id: int | None = None,
) -> WorkerRun:
    """Write a QUEUED row in its own committed transaction, so it is durable before anyone sees it.

    ``not_before_delay_s`` is a delay from the database's now(), never a client timestamp.
    Raises ``WorkerRunAlreadyActive`` (carrying the active run) when the worker's slot is taken.
    """
    clean = check_enqueue(worker_name, request, trigger=trigger, attempt=attempt)
    params = {
        "worker_name": worker_name,
        "trigger": trigger,
        "requested_by": requested_by,
        "requested_by_user_id": requested_by_user_id,
        "request": json.dumps(clean),
        "attempt": attempt,
        "retry_of": retry_of,
        "delay_seconds": not_before_delay_s,
        "schedule_id": schedule_id,
    }
    return _insert_into_slot(engine, _ENQUEUE, params)


# --- enqueue_retries: the retry policy's statement (scrinalia/scheduler/retry.py holds the policy) --------

_ENQUEUE_RETRIES = QUERIES["enqueue_retries"].text()


@dataclass(frozen=True, slots=True)
class EnqueuedRetry:
    run_id: uuid.UUID
    worker_name: str
    attempt: int
    retry_of: uuid.UUID


def enqueue_retries(
    engine: Engine, *, max_attempts: int, base_delay_s: float, cap_s: float, jitter: float
) -> list[EnqueuedRetry]:
    """The retries the policy's numbers call for, in one statement (docs/operations.md, "Retry policy")."""
    params = {"cap_s": cap_s, "base_s": base_delay_s, "jitter": jitter, "attempt_limit": max_attempts}
    with engine.begin() as conn:
        return [EnqueuedRetry(**r._mapping) for r in conn.execute(_ENQUEUE_RETRIES, params).all()]


# --- claim ---------------------------------------------------------------------------------------

_CLAIM_NEXT = QUERIES["claim_next"].text(run_columns=RUN_COLUMNS).bindparams(
    bindparam("runner_id", type_=UUID(as_uuid=True)),
    bindparam("capabilities", type_=ARRAY(Text)),
)


def claim_next(
    engine: Engine, runner_id: uuid.UUID, capabilities: Iterable[str], lease_seconds: float
) -> WorkerRun | None:
    """Claim the oldest eligible QUEUED row this runner can run, or None. Safe under contention."""
    caps = list(capabilities)
    if not caps:
        return None
    with one_statement(engine) as conn:
        row = conn.execute(
            _CLAIM_NEXT,
            {"runner_id": runner_id, "capabilities": caps, "lease_seconds": float(lease_seconds)},
        ).one_or_none()
    return WorkerRun.from_row(row) if row is not None else None


# --- the one-shot CLI: a RUNNING row of its own ---------------------------------------------------

_CREATE_RUNNING = QUERIES["create_running"].text(run_columns=RUN_COLUMNS).bindparams(
    bindparam("runner_id", type_=UUID(as_uuid=True)))


def create_running(
    engine: Engine,
    worker_name: str,
    request: Mapping[str, Any],
    *,
    runner_id: uuid.UUID,
    lease_seconds: float,
    requested_by: str | None = None,
) -> WorkerRun:
    """The CLI's claim: insert the row already RUNNING under its own runner id and lease (ADR gap 3)."""
    validate_worker_name(worker_name)
    clean = validate_request(request)
    params = {
        "worker_name": worker_name,
        "requested_by": requested_by,
        "request": json.dumps(clean),
        "runner_id": runner_id,
        "lease_seconds": float(lease_seconds),
    }
    return _insert_into_slot(engine, _CREATE_RUNNING, params)


def _insert_into_slot(engine: Engine, statement: Any, params: Mapping[str, Any]) -> WorkerRun:
    """Run an INSERT of an active row in its own committed transaction; the slot's unique index
    turns a second active row into ``WorkerRunAlreadyActive`` carrying the run that holds the slot."""
    try:
        with one_statement(engine) as conn:
            row = conn.execute(statement, params).one()
    except IntegrityError as exc:
        if isinstance(exc.orig, UniqueViolation) and "uq_worker_run_active" in str(exc.orig):
            worker_name = params["worker_name"]
            raise WorkerRunAlreadyActive(worker_name, active_run(engine, worker_name)) from None
        raise
    return WorkerRun.from_row(row)


# --- record_start --------------------------------------------------------------------------------

_RECORD_START = QUERIES["record_start"].text().bindparams(*_RUN_AND_RUNNER)


@dataclass(frozen=True, slots=True)
class StartParams:
    """``record_start``'s fields: what actually runs, as the supervisor resolved it at claim."""

    engine_name: str | None
    preset: str | None
    config: Mapping[str, Any] | None
    options: Mapping[str, Any] | None


def record_start(engine: Engine, run_id: uuid.UUID, runner_id: uuid.UUID, params: StartParams) -> bool:
    """Write what actually runs (resolved at claim by the supervisor, before the child starts: the truth,
    next to the request's promise). The configuration and options go to their own row, once: the run's
    row is rewritten by every heartbeat and progress, and each version would copy them (decision 0394).

    Returns False when the row is not this runner's RUNNING row any more (the run was lost).
    """
    with one_statement(engine) as conn:
        started = conn.execute(
            _RECORD_START,
            {"run_id": run_id, "runner_id": runner_id, "engine_name": params.engine_name,
             "preset": params.preset, "config": _json(params.config), "options": _json(params.options)},
        ).first()
    return started is not None


# --- heartbeat -----------------------------------------------------------------------------------

_HEARTBEAT = QUERIES["heartbeat"].text().bindparams(bindparam("runner_id", type_=UUID(as_uuid=True)))


def heartbeat(
    engine: Engine,
    runner_id: uuid.UUID,
    lease_seconds: float,
    *,
    progress: Mapping[Any, Mapping[str, Any]] | None = None,
    children: Sequence[Mapping[str, Any]] | None = None,
    warm: Mapping[str, Any] | None = None,
) -> HeartbeatResult:
    """Renew the registry row and every RUNNING row of this runner in one statement.

    ``progress`` maps run ids to their latest progress; ``children`` is the registry's snapshot (None:
    unchanged); ``warm`` the fork server's warm models (None: unchanged; decision 0381). The cost is one
    statement per tick whatever the concurrency. An unchanged snapshot is not rewritten: the row keeps
    its value (a TOASTed one keeps its chunks), and with no index on the columns a beat changes the
    registry update is HOT (decision 0072).
    """
    params = {
        "runner_id": runner_id,
        "lease_seconds": float(lease_seconds),
        "progress": _json({str(k): v for k, v in (progress or {}).items()}),
        "children": _json(children),
        "warm": _json(warm),
    }
    with one_statement(engine) as conn:
        rows = conn.execute(_HEARTBEAT, params).all()
    first = rows[0]
    held = {row.run_id: row.cancel_requested_at for row in rows if row.run_id is not None}
    return HeartbeatResult(
        registry_renewed=bool(first.registry_renewed),
        held=held,
        drain_requested_at=first.drain_requested_at,
        db_now=first.db_now,
        lease_expires_at=first.lease_expires_at,
    )


# --- finish --------------------------------------------------------------------------------------

_FINISH = QUERIES["finish"].text(run_columns=RUN_COLUMNS, error_max=str(ERROR_MAX)).bindparams(
    *_RUN_AND_RUNNER)


def check_finish(status: str, exit_reason: str | None) -> None:
    """What ``finish`` refuses before it sends anything (``ValueError``: a caller's bug)."""
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"finish needs a terminal status, not {status!r}")
    if exit_reason is not None and exit_reason not in EXIT_REASONS:
        raise ValueError(f"unknown exit_reason {exit_reason!r}")


@dataclass(frozen=True, slots=True)
class FinishParams:
    """``finish``'s fields (River's ``...Params``): the terminal status and what the end left. A JSON field
    left None keeps the row's value (``COALESCE``). Refused at construction (``check_finish``: a caller's
    bug), so nothing is sent."""

    status: str
    error: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    exit_reason: str | None = None
    progress: Mapping[str, Any] | None = None
    metrics: Mapping[str, Any] | None = None
    result: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        check_finish(self.status, self.exit_reason)


def finish(engine: Engine, run_id: uuid.UUID, runner_id: uuid.UUID, params: FinishParams) -> WorkerRun | None:
    """Close this runner's RUNNING row. None means the row was lost: write nothing more for it."""
    bound = {"run_id": run_id, "runner_id": runner_id, "status": params.status, "error": params.error,
             "exit_code": params.exit_code, "exit_signal": params.exit_signal, "exit_reason": params.exit_reason,
             "progress": _json(params.progress), "metrics": _json(params.metrics), "result": _json(params.result)}
    with one_statement(engine) as conn:
        row = conn.execute(_FINISH, bound).one_or_none()
    return WorkerRun.from_row(row) if row is not None else None


# --- expire_leases -------------------------------------------------------------------------------

_EXPIRE_LEASES = QUERIES["expire_leases"].text(run_columns=RUN_COLUMNS)


def expire_leases(engine: Engine) -> list[WorkerRun]:
    """Mark every RUNNING row whose lease has passed INTERRUPTED, whoever held it.

    ``SKIP LOCKED``: a row another session has locked right now (a heartbeat, a finish, a batch's
    commit-time fence check: each one short statement) is left to the next expiry instead of waited on,
    so no stuck session can stall the expiry of everyone else's rows (decision 0100)."""
    with one_statement(engine) as conn:
        return [WorkerRun.from_row(r) for r in conn.execute(_EXPIRE_LEASES).all()]


# --- the batch fence (decision 0100) ---------------------------------------------------------------

#: The SQLSTATE the commit-time check (migration 0008) raises when a batch's run is not held any more.
#: Migrations are frozen, so 0008 writes the literal; ``tests/ledger/test_one_home.py`` holds the two equal.
BATCH_FENCE_SQLSTATE = "SF001"
#: The commit-time check's own lock_timeout (``SET lock_timeout = '2s'`` on migration 0008's function): the
#: longest a COMMIT waits for the run's row FOR SHARE before it fails ``blocked``.
BATCH_FENCE_LOCK_TIMEOUT_S = 2.0

_REGISTER_BATCH_FENCE = QUERIES["register_batch_fence"].text().bindparams(*_RUN_AND_RUNNER)


def register_batch_fence(conn: Connection, run_id: uuid.UUID, runner_id: uuid.UUID) -> bool:
    """Fence the batch open on ``conn`` (a transaction, never autocommit): False when the lease is already
    gone (nothing may be written); True means the lease is checked again when the transaction commits,
    which then fails with SQLSTATE ``BATCH_FENCE_SQLSTATE`` if the lease has ended meanwhile."""
    return conn.execute(_REGISTER_BATCH_FENCE, {"run_id": run_id, "runner_id": runner_id}).rowcount == 1


def is_batch_fence_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` (a SQLAlchemy or psycopg error) is the commit-time fence refusing a batch."""
    orig = getattr(exc, "orig", None) or exc
    return getattr(orig, "sqlstate", None) == BATCH_FENCE_SQLSTATE


# --- request_cancel ------------------------------------------------------------------------------

_REQUEST_CANCEL = QUERIES["request_cancel"].text(run_columns=RUN_COLUMNS).bindparams(
    bindparam("run_id", type_=UUID(as_uuid=True)))


def request_cancel(engine: Engine, run_id: uuid.UUID, requested_by: str | None = None) -> WorkerRun:
    """An unclaimed QUEUED run closes CANCELLED at once; a RUNNING one gets ``cancel_requested_at``.

    A claim racing with this statement is safe: whichever commits first, the other re-reads the row,
    so a just-claimed run gets the flag instead of being closed under its runner.
    Raises ``RunNotFound`` or ``RunAlreadyFinished``.
    """
    with one_statement(engine) as conn:
        row = conn.execute(_REQUEST_CANCEL, {"run_id": run_id, "requested_by": requested_by}).one_or_none()
    if row is not None:
        return WorkerRun.from_row(row)
    existing = get_run(engine, run_id)
    if existing is None:
        raise RunNotFound(run_id)
    raise RunAlreadyFinished(existing)


# --- reads ---------------------------------------------------------------------------------------

_GET_RUN = QUERIES["get_run"].text(run_columns=RUN_COLUMNS).bindparams(
    bindparam("run_id", type_=UUID(as_uuid=True))
)

_ACTIVE_RUN = QUERIES["active_run"].text(run_columns=RUN_COLUMNS)

# One index probe per worker (uq_worker_run_active for the active one, ix_worker_runs_worker_id for
# the last finished one), so the panel's cost does not grow with history.
_ACTIVE_AND_LAST = text(
    """
    SELECT w.worker_name,
           (SELECT to_jsonb(a) FROM archive_worker_runs a
             WHERE a.worker_name = w.worker_name AND a.status IN ('QUEUED', 'RUNNING')) AS active,
           (SELECT to_jsonb(l) FROM archive_worker_runs l
             WHERE l.worker_name = w.worker_name
               AND l.status IN ('SUCCESS', 'FAILED', 'INTERRUPTED', 'CANCELLED')
             ORDER BY l.id DESC LIMIT 1) AS last
      FROM unnest(CAST(:workers AS text[])) AS w(worker_name)
    """
)


def get_run(engine: Engine, run_id: uuid.UUID) -> WorkerRun | None:
    with one_statement(engine) as conn:
        row = conn.execute(_GET_RUN, {"run_id": run_id}).one_or_none()
    return WorkerRun.from_row(row) if row is not None else None


_FIND_RUN_IDS = text(
    """SELECT run_id FROM archive_worker_runs
        WHERE right(replace(run_id::text, '-', ''), :n) = :digits OR left(replace(run_id::text, '-', ''), :n) = :digits
        ORDER BY id DESC LIMIT :limit"""
)


def find_run_ids(engine: Engine, digits: str, limit: int = 5) -> list[uuid.UUID]:
    """The runs whose id ends (the short id people see: ``run_ids.short_id``) or starts (an older log's
    8-digit prefix) with the hex ``digits``, newest first, at most ``limit``. A scan of the ledger: a
    person's lookup, not a protocol step."""
    with one_statement(engine) as conn:
        return list(conn.execute(_FIND_RUN_IDS, {"digits": digits.lower(), "n": len(digits),
                                                 "limit": limit}).scalars())


def active_run(engine: Engine, worker_name: str) -> WorkerRun | None:
    with one_statement(engine) as conn:
        row = conn.execute(_ACTIVE_RUN, {"worker_name": worker_name}).one_or_none()
    return WorkerRun.from_row(row) if row is not None else None


def active_and_last_runs(
    engine: Engine | Connection, worker_names: Iterable[str]
) -> dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """For each worker: (active run, last terminal run) as JSON dicts, in one statement."""
    with one_statement(engine) as conn:
        rows = conn.execute(_ACTIVE_AND_LAST, {"workers": list(worker_names)}).all()
    return {r.worker_name: (r.active, r.last) for r in rows}


# --- record_progress -----------------------------------------------------------------------------

_RECORD_PROGRESS = QUERIES["record_progress"].text().bindparams(
    bindparam("runner_id", type_=UUID(as_uuid=True)))


def record_progress(
    engine: Engine, runner_id: uuid.UUID, progress: Mapping[Any, Mapping[str, Any]]
) -> int:
    """Write the latest progress of this runner's children in one statement; returns the rows changed.

    Separate from the heartbeat on purpose: the heartbeat's cadence is the lease's (15 s by default),
    progress should reach the panel within about a second. The caller sends only what changed.
    """
    if not progress:
        return 0
    payload = json.dumps({str(k): v for k, v in progress.items()}, default=str)
    with engine.begin() as conn:
        return conn.execute(_RECORD_PROGRESS, {"runner_id": runner_id, "progress": payload}).rowcount


# --- notifications -------------------------------------------------------------------------------

# Triggers (migration 0006) announce every visible change of a run or a runner on this channel, at
# COMMIT; ``scrinalia.domains.archive.ledger_events`` listens. Payloads:
#   {"kind": "run", "run_id": ..., "worker": ..., "status": ..., "cancel": bool}   {"kind": "runner", "runner_id": ...}
LEDGER_CHANNEL = "scrinalia_ledger"
LISTEN_STATEMENT = f"LISTEN {LEDGER_CHANNEL}"
