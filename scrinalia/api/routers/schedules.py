"""/api/v1/system/schedules: what the scheduler enqueues, and when (OPERATE for every write)."""
from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from scrinalia.api import views
from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, field_errors, not_found
from scrinalia.api.schemas import SYSTEM_ERRORS, ErrorOut, ScheduleEnabledIn, ScheduleIn, ScheduleOut, SchedulesOut
from scrinalia.api.security import Principal, system_guard
from scrinalia.domains.archive.errors import InvalidRunRequest
from scrinalia.domains.archive.workers.sdk import UnknownWorker
from scrinalia.scheduler import quarantine, schedules

log = logging.getLogger("scrinalia.api.schedules")
router = APIRouter(prefix="/schedules", tags=["schedules"])
_ERR = SYSTEM_ERRORS


def _out(schedule: schedules.Schedule) -> dict[str, Any]:
    out = asdict(schedule)
    for key in ("next_run_at", "last_tick_at", "quarantine_resumed_at"):
        out[key] = out[key].isoformat() if out[key] is not None else None
    out["last_run_id"] = str(out["last_run_id"]) if out["last_run_id"] is not None else None
    out["quarantined"] = schedule.quarantined
    out["quarantine"] = views.quarantine_json(schedule)
    return out


@router.get("", response_model=SchedulesOut, responses=_ERR,
            summary="Every schedule, with its next tick and last outcome")
def list_schedules(request: Request) -> dict[str, Any]:
    return {"schedules": [_out(s) for s in schedules.list_schedules(ctx(request).engine)]}


@router.post("", status_code=201, response_model=ScheduleOut,
             responses={**_ERR, 409: {"model": ErrorOut, "description": "The worker already has a schedule"}},
             summary="Add a schedule (OPERATE); its request is validated like a run's; one per worker")
def create_schedule(body: ScheduleIn, request: Request, principal: Principal = Depends(system_guard)) -> Any:
    c = ctx(request)
    try:
        schedule = schedules.create_schedule(
            c.engine, body.worker_name, body.interval_seconds, body.request.model_dump(exclude_unset=True),
            catalogue=c.catalogue, created_by=principal.label, first_delay_s=body.first_delay_seconds)
    except UnknownWorker as exc:
        raise field_errors({"worker_name": exc.message}) from None
    except InvalidRunRequest as exc:
        raise field_errors({f"request.{exc.field}": exc.message}) from None
    except schedules.ScheduleExists as exc:
        raise ApiError(409, "schedule_exists", str(exc), schedule_id=exc.existing) from None
    log.info("schedule %s added for %s every %s s (user %s)", schedule.id, schedule.worker_name,
             schedule.interval_seconds, principal.user.id)
    return _out(schedule)


@router.patch("/{schedule_id}", response_model=ScheduleOut, responses=_ERR,
              summary="Enable or disable a schedule (OPERATE)")
def set_enabled(schedule_id: int, body: ScheduleEnabledIn, request: Request,
                principal: Principal = Depends(system_guard)) -> Any:
    schedule = schedules.set_enabled(ctx(request).engine, schedule_id, body.enabled, by=principal.label)
    if schedule is None:
        raise not_found(f"schedule {schedule_id}")
    return _out(schedule)


@router.delete("/{schedule_id}", status_code=204, responses=_ERR, summary="Remove a schedule (OPERATE)")
def delete_schedule(schedule_id: int, request: Request, principal: Principal = Depends(system_guard)) -> Response:
    if not schedules.delete_schedule(ctx(request).engine, schedule_id):
        raise not_found(f"schedule {schedule_id}")
    return Response(status_code=204)


@router.post("/{schedule_id}/resume", response_model=ScheduleOut,
             responses={**_ERR, 409: {"model": ErrorOut, "description": "The schedule is not quarantined"}},
             summary="Lift a schedule's crash-loop quarantine and enable it again (OPERATE)")
def resume(schedule_id: int, request: Request, principal: Principal = Depends(system_guard)) -> Any:
    engine = ctx(request).engine
    try:
        if not quarantine.resume(engine, schedule_id, by=principal.label):
            raise not_found(f"schedule {schedule_id}")
    except quarantine.NotQuarantined as exc:
        raise ApiError(409, "not_quarantined", str(exc)) from None
    schedule = schedules.get_schedule(engine, schedule_id)
    if schedule is None:  # removed in between
        raise not_found(f"schedule {schedule_id}")
    log.info("schedule %s (%s) resumed from quarantine (user %s)", schedule_id, schedule.worker_name,
             principal.user.id)
    return _out(schedule)
