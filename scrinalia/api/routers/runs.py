"""/api/v1/system/runs: the ledger, newest first (keyset), one run with its attempts, cancel."""
from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from scrinalia.api import views
from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, field_errors, not_found
from scrinalia.api.schemas import SYSTEM_ERRORS, CancelOut, ErrorOut, RunDetailOut, RunPageOut, RunStatus, RunTrigger
from scrinalia.api.security import Principal, system_guard
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import RunAlreadyFinished, RunNotFound

log = logging.getLogger("scrinalia.api.runs")
router = APIRouter(prefix="/runs", tags=["runs"])
_ERR = SYSTEM_ERRORS


@router.get("", response_model=RunPageOut, responses=_ERR, summary="Runs, newest first, filtered; keyset pagination")
def list_runs(
    request: Request,
    worker: str | None = Query(default=None, min_length=1, max_length=100),
    status: list[RunStatus] | None = Query(default=None, description="Repeat for several"),
    fingerprint: str | None = Query(default=None, min_length=1, max_length=200),
    trigger: RunTrigger | None = Query(default=None),
    cursor: str | None = Query(default=None, max_length=20, description="next_cursor of the previous page"),
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


@router.get("/{run_id}", response_model=RunDetailOut, responses=_ERR, summary="One run with its chain of attempts")
def get_run(run_id: uuid.UUID, request: Request) -> dict[str, Any]:
    detail = views.run_detail(ctx(request).engine, run_id)
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
