"""/api/v1/system/runners and /api/v1/system/failures."""
from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from scrinalia.api import views
from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, field_errors, not_found
from scrinalia.api.schemas import SYSTEM_ERRORS, ErrorOut, FailuresOut, RunnerOut, RunnersOut
from scrinalia.api.security import Principal, system_guard
from scrinalia.domains.archive import registry

log = logging.getLogger("scrinalia.api.runners")
router = APIRouter(tags=["runners"])
_ERR = SYSTEM_ERRORS


@router.get("/runners", response_model=RunnersOut, responses=_ERR,
            summary="Online, stale and (recently) stopped runners with capabilities, versions and children")
def list_runners(request: Request, stopped_within_hours: int = Query(default=24, ge=0, le=24 * 365)) -> dict[str, Any]:
    engine = ctx(request).engine
    return {"runners": views.runners_view(engine, stopped_within_hours=stopped_within_hours),
            "xmin_horizon": views.xmin_horizon_view(engine)}


@router.post(
    "/runners/{runner_id}/drain",
    status_code=202,
    response_model=RunnerOut,
    responses={**_ERR, 409: {"model": ErrorOut, "description": "The runner has stopped"}},
    summary="Ask a runner to drain (OPERATE): it stops claiming, finishes its runs and exits",
)
def drain_runner(runner_id: uuid.UUID, request: Request, principal: Principal = Depends(system_guard)) -> Any:
    engine = ctx(request).engine
    if not registry.request_drain(engine, runner_id, requested_by=principal.label):
        if registry.get_runner(engine, runner_id) is None:
            raise not_found(f"runner {runner_id}")
        raise ApiError(409, "runner_stopped", f"runner {runner_id} has stopped")
    log.info("drain requested of runner %s (user %s)", runner_id, principal.user.id)
    rows = views.runners_view(engine, stopped_within_hours=0)
    row = next((r for r in rows if r["runner_id"] == str(runner_id)), None)
    return JSONResponse(row, status_code=202)


@router.get("/failures", response_model=FailuresOut, responses=_ERR, tags=["failures"],
            summary="Errors of the last N days grouped by fingerprint")
def list_failures(request: Request, days: int = Query(default=30, ge=1, le=3650),
                  worker: str | None = Query(default=None, min_length=1, max_length=100),
                  limit: int = Query(default=200, ge=1, le=1000)) -> dict[str, Any]:
    c = ctx(request)
    if days > c.api.failures_max_days:
        raise field_errors({"days": f"must be at most {c.api.failures_max_days}"})
    return {"days": days, "failures": views.failures(c.engine, days=days, worker=worker, limit=limit)}
