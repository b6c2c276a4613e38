"""/api/v1/system/runs: the ledger, newest first (keyset), one run with its attempts, cancel."""
from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from scrinalia.api import views
from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, field_errors, not_found
from scrinalia.api.schemas import (
    SYSTEM_ERRORS,
    CancelOut,
    ErrorOut,
    RunConflictOut,
    RunDetailOut,
    RunOut,
    RunPageOut,
    RunStatus,
    RunTrigger,
)
from scrinalia.api.security import Principal, system_guard
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import InvalidRunRequest, RunAlreadyFinished, RunNotFound, WorkerRunAlreadyActive
from scrinalia.domains.archive.run_ids import typed_run_id
from scrinalia.domains.archive.workers.validation import validate_run_request

log = logging.getLogger("scrinalia.api.runs")
router = APIRouter(prefix="/runs", tags=["runs"])
_ERR = SYSTEM_ERRORS

#: What ``typed_run_id`` reads, declared (not enforced: its own message names the rule): 8 to 32 hex
#: digits, hyphens anywhere. A UUID has 32; fewer is a short id.
RUN_ID_PATTERN = r"^-*([0-9A-Fa-f]-*){8,32}$"


@router.get("", response_model=RunPageOut, responses=_ERR, summary="Runs, newest first, filtered; keyset pagination")
def list_runs(
    request: Request,
    worker: str | None = Query(default=None, min_length=1, max_length=100),
    status: list[RunStatus] | None = Query(default=None, description="Repeat for several"),
    fingerprint: str | None = Query(default=None, min_length=1, max_length=200),
    trigger: RunTrigger | None = Query(default=None),
    cursor: str | None = Query(default=None, max_length=20, pattern=r"^[0-9]+$",
                                description="next_cursor of the previous page"),
    limit: int = Query(default=50, ge=1, le=1000),
) -> dict[str, Any]:
    c = ctx(request)
    before_id = None
    if cursor is not None:
        if not (cursor.isascii() and cursor.isdigit()):  # "²".isdigit() is true, int("²") is not
            raise field_errors({"cursor": "is not a cursor of this list"})
        before_id = int(cursor)
    runs, next_cursor = views.list_runs(
        c.engine, worker=worker, statuses=list(status) if status else None, fingerprint=fingerprint,
        trigger=trigger, before_id=before_id, limit=min(limit, c.api.runs_page_max),
    )
    return {"runs": runs, "next_cursor": next_cursor}


@router.get("/{run_id}", response_model=RunDetailOut,
            responses={**_ERR, 409: {"model": ErrorOut, "description": "A short id that several runs share "
                                                                       "(run_ids_ambiguous, with run_ids)"}},
            summary="One run with its chain of attempts, by its id or a short id (its last 8-12 hex digits)")
def get_run(run_id: str = Path(max_length=40, json_schema_extra={"pattern": RUN_ID_PATTERN},
                              description="A run id, or 8 to 31 of its last hex digits; hyphens anywhere"),
            *, request: Request) -> dict[str, Any]:
    engine = ctx(request).engine
    typed = typed_run_id(run_id)
    if typed is None:
        raise field_errors({"run_id": "is not a run id (a UUID, or 8 to 31 of its hex digits)"})
    if isinstance(typed, str):
        found = ledger.find_run_ids(engine, typed)
        if len(found) > 1:
            raise ApiError(409, "run_ids_ambiguous", f"{len(found)} runs have an id with {typed}; give more digits",
                           run_ids=[str(r) for r in found])
        typed = found[0] if found else None
    detail = views.run_detail(engine, typed) if typed is not None else None
    if detail is None:
        raise not_found(f"run {run_id}")
    return detail


@router.post(
    "/{run_id}/cancel",
    response_model=CancelOut,
    responses={
        **_ERR,
        202: {"model": CancelOut, "description": "Cancellation requested of a RUNNING run; it stops at its next batch"},
        409: {"model": ErrorOut, "description": "The run has already ended; run is included"},
    },
    summary="Cancel a run (OPERATE): 200 CANCELLED at once when unclaimed, 202 when running, 409 when ended",
)
def cancel_run(run_id: uuid.UUID, request: Request, principal: Principal = Depends(system_guard)) -> Any:
    try:
        run = ledger.request_cancel(ctx(request).engine, run_id, requested_by=principal.label)
    except RunNotFound:
        raise not_found(f"run {run_id}") from None
    except RunAlreadyFinished as exc:
        raise ApiError(409, "run_finished", str(exc), run=views.run_json(exc.run)) from None
    cancelled = run.status == "CANCELLED"
    log.info("cancel of run %s: %s (user %s)", run_id, "done" if cancelled else "requested", principal.user.id)
    return JSONResponse({"run": views.run_json(run), "cancelled": cancelled}, status_code=200 if cancelled else 202)


#: What an operator may retry: a run that failed or was interrupted. A SUCCESS is run again with Run, a
#: CANCELLED one was stopped on purpose.
RETRYABLE = ("FAILED", "INTERRUPTED")


@router.post(
    "/{run_id}/retry",
    status_code=201,
    response_model=RunOut,
    responses={
        **_ERR,
        409: {"model": RunConflictOut,
              "description": "The run is not FAILED or INTERRUPTED (run_not_retryable), or the worker's slot is "
                             "taken (run_active, with active_run)"},
    },
    summary="Retry a failed or interrupted run (OPERATE): a new QUEUED row with retry_of, its request re-validated",
)
def retry_run(run_id: uuid.UUID, request: Request, principal: Principal = Depends(system_guard)) -> Any:
    c = ctx(request)
    run = ledger.get_run(c.engine, run_id)
    if run is None:
        raise not_found(f"run {run_id}")
    if run.status not in RETRYABLE:
        raise ApiError(409, "run_not_retryable", f"run {run_id} is {run.status}; only a FAILED or INTERRUPTED run "
                       "is retried", run=views.run_json(run))
    try:
        clean = validate_run_request(c.catalogue, c.engine, run.worker_name, run.request or {})
        retry = ledger.enqueue(c.engine, run.worker_name, clean, trigger=principal.trigger,
                               requested_by=principal.label, requested_by_user_id=principal.user.id,
                               attempt=run.attempt + 1,
                               retry_of=run.run_id)
    except InvalidRunRequest as exc:
        raise field_errors({exc.field: exc.message}) from None
    except WorkerRunAlreadyActive as exc:
        raise ApiError(409, "run_active", str(exc), active_run=views.run_json(exc.active)) from None
    log.info("retry of run %s as %s (user %s)", run_id, retry.run_id, principal.user.id)
    return JSONResponse(views.run_json(retry), status_code=201,
                        headers={"Location": f"/api/v1/system/runs/{retry.run_id}"})
