"""Request and response models: what the OpenAPI schema (GET /api/v1/openapi.json) documents.

Request models are strict (no bool or string coerced into a number, no number into a bool) and every
string in them, also deep inside ``options`` and ``engine_options``, must be storable by PostgreSQL:
no NUL character, no lone UTF-16 surrogate, no non-finite number. What PostgreSQL could not store is a
422 that names the field, before anything is written.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from fastapi import Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from scrinalia.domains.archive.ledger import BATCH_SIZE_MAX, BATCH_SIZE_MIN

RunStatus = Literal["QUEUED", "RUNNING", "SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"]
RunTrigger = Literal["CLI", "API", "SCHEDULE", "PANEL"]  # PANEL: the panel (cookie session)
Role = Literal["ADMIN", "CURATOR", "VIEWER"]
SettingsAction = Literal["PUT", "DELETE"]


def _stored(known: Any) -> WithJsonSchema:
    """The schema of an answer's value read from a column that a newer release may widen (an enum label, a
    wider CHECK: additive, decision 0125). This release writes one of ``known`` (a ``Literal``); another is
    answered as it is (decision 0393): through an upgrade's window, or on a newer schema that declares this
    release compatible (decision 0392), one row of a newer release must not make the whole answer a 500."""
    values = list(get_args(known))
    return WithJsonSchema({"type": "string", "examples": values, "description": f"One of {', '.join(values)}; "
                           "a newer release's schema may add values (decision 0393)."})


StoredRunStatus = Annotated[str, _stored(RunStatus)]
StoredRunTrigger = Annotated[str, _stored(RunTrigger)]
StoredSettingsAction = Annotated[str, _stored(SettingsAction)]


def unstorable(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text (or inside jsonb), or None."""
    if "\x00" in value:
        return "must not contain a NUL character (U+0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (a lone surrogate cannot be stored)"
    return None


def _storable_text(value: str) -> str:
    problem = unstorable(value)
    if problem:
        raise ValueError(problem)
    return value


def _storable_json(value: Any, path: str = "") -> Any:
    """Walk a JSON value: keys and strings storable, numbers finite (jsonb has no NaN or Infinity)."""
    where = f" at {path}" if path else ""
    if isinstance(value, str):
        problem = unstorable(value)
        if problem:
            raise ValueError(f"{problem}{where}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number{where}")
    elif isinstance(value, dict):
        _storable_object(value, path, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _storable_json(item, f"{path}[{index}]")
    return value


def _storable_object(value: dict[Any, Any], path: str, where: str) -> None:
    for key, item in value.items():
        problem = unstorable(str(key))
        if problem:
            raise ValueError(f"a key {problem}{where}")
        _storable_json(item, f"{path}.{key}" if path else str(key))


Text = Annotated[str, AfterValidator(_storable_text)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable_json)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- errors ---


class ErrorOut(Open):
    error: str = Field(description="A stable code: unauthenticated, forbidden, csrf_failed, password_change_required, "
                                   "not_found, run_active, run_finished, validation_failed, locked, rate_limited, ...")
    message: str
    fields: dict[str, str] | None = Field(default=None, description="422: a message per offending field")


# The answers every /system route may give besides its own: no session, role or CSRF, unknown, invalid.
SYSTEM_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut}, 403: {"model": ErrorOut}, 404: {"model": ErrorOut}, 422: {"model": ErrorOut},
}


# --- identity ---


class UserOut(BaseModel):
    id: int
    email: str
    role: Role
    is_active: bool
    must_change_password: bool
    last_login_at: str | None = None
    created_at: str


class LoginIn(Strict):
    email: Text = Field(max_length=254)
    password: Text = Field(max_length=1024)
    issue_token: bool = Field(
        default=False,
        description="true: answer the session token in the body (for scripts, as a Bearer header) and set no cookie",
    )


class SessionOut(BaseModel):
    user: UserOut
    csrf_token: str = Field(description="Send it in X-CSRF-Token with every write made with the cookie")
    expires_at: str
    must_change_password: bool
    token: str | None = Field(default=None, description="Only with issue_token=true")


class ChangePasswordIn(Strict):
    current_password: Text = Field(max_length=1024)
    new_password: Text = Field(max_length=1024)


# --- runs ---


#: What ``ledger.check_request_shape`` enforces, declared in the document only (``json_schema_extra``): the
#: request keeps one validation path and its messages (decision 0135); the document states the rule.
_NAMED: dict[str, Any] = {"minLength": 1, "pattern": r"\S"}


class RunRequestIn(Strict):
    """A run request (and the shape of persisted settings): every field optional; the catalogue validates."""

    engine_name: Text | None = Field(default=None, max_length=200, json_schema_extra=_NAMED,
                                     description="Not blank; one of the worker's engines")
    preset: Text | None = Field(default=None, max_length=200, json_schema_extra=_NAMED,
                                description="Not blank; one of the worker's presets")
    db_batch_size: int | None = Field(default=None, description="An integer: true or \"10\" is refused",
                                      json_schema_extra={"minimum": BATCH_SIZE_MIN, "maximum": BATCH_SIZE_MAX})
    options: JsonObject | None = None
    engine_options: JsonObject | None = None


class SettingsIn(RunRequestIn):
    expected_revision: int | None = Field(
        default=None,
        description="Optimistic concurrency: refuse with 409 unless the settings are at this revision (0: none)",
    )


class RunOut(Open):
    id: int
    run_id: str
    worker_name: str
    status: StoredRunStatus
    trigger: StoredRunTrigger
    requested_by: str | None = None
    request: dict[str, Any]
    engine_name: str | None = None
    preset: str | None = None
    queued_at: str
    started_at: str | None = None
    finished_at: str | None = None
    duration_ms: int | None = None
    runner_id: str | None = None
    attempt: int
    retry_of: str | None = None
    not_before: str | None = None
    cancel_requested_at: str | None = None
    error: str | None = None
    error_fingerprint: str | None = None
    exit_reason: str | None = None
    progress: dict[str, Any] | None = None


class AttemptOut(Open):
    run_id: str
    attempt: int
    status: StoredRunStatus
    retry_of: str | None = None


class RunDetailOut(RunOut):
    attempts: list[AttemptOut] = Field(description="The retry chain this run belongs to, first attempt first")
    runner: dict[str, Any] | None = None


class RunPageOut(BaseModel):
    runs: list[RunOut]
    next_cursor: str | None = Field(description="Pass it as ?cursor= for the next (older) page; null on the last page")


class RunConflictOut(ErrorOut):
    active_run: RunOut | None = None


class CancelOut(BaseModel):
    run: RunOut
    cancelled: bool = Field(description="true: CANCELLED now (200); false: cancellation requested of a RUNNING "
                                        "run (202)")


# --- workers ---


class QueuedReason(BaseModel):
    code: Literal["backing_off", "no_runner", "draining", "schema_behind", "runners_busy", "waiting_for_device",
                  "no_device_fits", "waiting_for_claim"]
    message: str
    not_before: str | None = None


class Counts(BaseModel):
    pending: int | None
    processed: int | None
    failed: int | None


class WorkerSettingsView(BaseModel):
    persisted: dict[str, Any] | None
    effective: dict[str, Any]


class Quarantine(BaseModel):
    """A schedule's crash-loop quarantine (decision 0165)."""

    schedule_id: int
    quarantined_at: str
    reason: str | None
    fingerprint: str | None = Field(description="The error fingerprint the last chains ended with")
    run_id: str | None = Field(description="The last failed run")


class WorkerOut(Open):
    name: str
    label: str
    description: str
    unit: str
    engines: list[dict[str, Any]]
    presets: list[dict[str, Any]]
    options: list[dict[str, Any]]
    settings: WorkerSettingsView
    counts: Counts
    active_run: RunOut | None
    last_run: RunOut | None
    runners: list[dict[str, Any]] = Field(description="Online runners that advertise this worker")
    queued_reason: QueuedReason | None = Field(description="For a QUEUED active run: why it is not running yet")
    quarantine: Quarantine | None = Field(default=None, description="The worker's schedule is quarantined "
                                                                  "for a crash loop (resume it on Schedules)")


class WorkersOut(BaseModel):
    db_now: str
    schema_revision: str | None
    runners_online: int
    counts_as_of: str | None = Field(description="When the unit counts were computed (now, unless "
                                                 "API_COUNTS_MAX_AGE_SECONDS > 0 serves them from a cache)")
    workers: list[WorkerOut]


class SettingsWarning(BaseModel):
    field: str
    message: str


class SettingsOut(BaseModel):
    worker: str
    persisted: dict[str, Any] | None
    effective: dict[str, Any]
    warnings: list[SettingsWarning] = Field(
        default_factory=list,
        description="What is saved but may not run: a model directory that no online runner of the worker "
                    "reports seeing on its host (decision 0145)")


class RevisionOut(Open):
    revision: int
    action: StoredSettingsAction
    settings: dict[str, Any] | None
    changed_at: str
    changed_by: str | None


class RevisionsOut(BaseModel):
    worker: str
    revisions: list[RevisionOut]


# --- runners and failures ---


class RunnerOut(Open):
    runner_id: str
    name: str
    hostname: str
    state: Literal["online", "stale", "stopped"]
    package_version: str
    schema_revision: str | None
    capabilities: list[str]
    concurrency: int
    running: int
    busy: bool
    schema_mismatch: bool
    version_mismatch: bool
    children: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    drain_requested_at: str | None


class XminHorizonOut(BaseModel):
    """The oldest holder of the database's xmin horizon (decision 0371): while it holds, VACUUM keeps the
    dead row versions of the ledger's hot tables."""

    kind: Literal["session", "prepared", "slot"]
    age_seconds: float | None
    age_xids: int
    pid: int | None
    application_name: str | None
    state: str | None
    holder: str
    text: str


class RunnersOut(BaseModel):
    runners: list[RunnerOut]
    xmin_horizon: XminHorizonOut | None = Field(
        default=None, description="The oldest holder of the xmin horizon now; null when none holds one.")


class FailureGroupOut(BaseModel):
    fingerprint: str
    occurrences: int
    first_seen: str
    last_seen: str
    workers: list[str]
    statuses: list[str]
    sample_error: str | None
    sample_run_id: str


class FailuresOut(BaseModel):
    days: int
    failures: list[FailureGroupOut]


class HealthOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable"]
    schema_state: Literal["current", "behind", "ahead_compatible", "ahead_or_unknown", "unknown"] = Field(
        alias="schema")
    version: str
    #: The live panel's LISTEN: hears | deaf (notifications do not arrive, e.g. through PgBouncer in
    #: transaction mode: the panel polls) | connecting | idle (no stream open). Not part of "status".
    notifications: Literal["hears", "deaf", "connecting", "idle"] = "idle"


# --- schedules ---


class ScheduleIn(Strict):
    worker_name: Text = Field(min_length=1, max_length=100)
    interval_seconds: int = Field(ge=60, le=366 * 86_400, description="At least 60")
    request: RunRequestIn = Field(default_factory=RunRequestIn, description="The request of each scheduled run")
    first_delay_seconds: float = Field(default=0, ge=0, le=366 * 86_400,
                                       description="Seconds from now to the first tick (default: at once)")


class ScheduleEnabledIn(Strict):
    enabled: bool


class ScheduleOut(BaseModel):
    id: int
    worker_name: str
    interval_seconds: int
    request: dict[str, Any]
    enabled: bool
    next_run_at: str
    last_tick_at: str | None
    last_run_id: str | None
    last_outcome: str | None = Field(description="enqueued; skipped-busy when the worker's slot was taken; "
                                                 "refused: <field>: <why> when its request no longer validates "
                                                 "(no run written)")
    quarantined: bool = Field(default=False, description="Paused by the scheduler for a crash loop: its last N "
                                                         "retry chains ended FAILED with one fingerprint")
    quarantine: Quarantine | None = Field(default=None, description="Why it is quarantined (null when it is not)")
    quarantine_resumed_at: str | None = None
    quarantine_resumed_by: str | None = None


class SchedulesOut(BaseModel):
    schedules: list[ScheduleOut]


# --- inputs outside the bodies ---


def storable_inputs(request: Request) -> None:
    """An app-wide dependency: a query or path parameter that PostgreSQL could not store (a NUL, say
    ``?worker=a%00b``) is a 422 naming it, before any handler reads the database."""
    from scrinalia.api.errors import field_errors

    params = list(request.query_params.multi_items()) + [
        (name, value) for name, value in request.path_params.items() if isinstance(value, str)
    ]
    for name, value in params:
        problem = unstorable(name) or unstorable(value)
        if problem:
            raise field_errors({name if not unstorable(name) else "query": problem})
