"""Request and response models: what the OpenAPI schema (GET /api/v1/openapi.json) documents."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RunStatus = Literal["QUEUED", "RUNNING", "SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"]
RunTrigger = Literal["CLI", "API", "SCHEDULE"]
Role = Literal["ADMIN", "CURATOR", "VIEWER"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    email: str = Field(max_length=254)
    password: str = Field(max_length=1024)
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
    current_password: str = Field(max_length=1024)
    new_password: str = Field(max_length=1024)


# --- runs ---


class RunRequestIn(Strict):
    """A run request (and the shape of persisted settings): every field optional; the catalogue validates."""

    engine_name: str | None = Field(default=None, max_length=200)
    preset: str | None = Field(default=None, max_length=200)
    db_batch_size: int | None = Field(default=None, description="1..10000")
    options: dict[str, Any] | None = None
    engine_options: dict[str, Any] | None = None


class SettingsIn(RunRequestIn):
    expected_revision: int | None = Field(
        default=None, description="Optimistic concurrency: refuse with 409 unless the settings are at this revision (0: none)"
    )


class RunOut(Open):
    id: int
    run_id: str
    worker_name: str
    status: RunStatus
    trigger: RunTrigger
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
    status: RunStatus
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
    cancelled: bool = Field(description="true: CANCELLED now (200); false: cancellation requested of a RUNNING run (202)")


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


class WorkersOut(BaseModel):
    db_now: str
    schema_revision: str | None
    runners_online: int
    counts_as_of: str | None = Field(description="When the unit counts were computed (now, unless API_COUNTS_MAX_AGE_SECONDS > 0 serves them from a cache)")
    workers: list[WorkerOut]


class SettingsOut(BaseModel):
    worker: str
    persisted: dict[str, Any] | None
    effective: dict[str, Any]


class RevisionOut(Open):
    revision: int
    action: Literal["PUT", "DELETE"]
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


class RunnersOut(BaseModel):
    runners: list[RunnerOut]


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
    schema_state: Literal["current", "behind", "ahead_or_unknown", "unknown"] = Field(alias="schema")
    version: str


# --- schedules ---


class ScheduleIn(Strict):
    worker_name: str = Field(min_length=1, max_length=100)
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
    last_outcome: str | None = Field(description="enqueued, or skipped-busy when the worker's slot was taken")


class SchedulesOut(BaseModel):
    schedules: list[ScheduleOut]
