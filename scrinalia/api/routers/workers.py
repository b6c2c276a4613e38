"""/api/v1/system/workers: the catalogue with its state; enqueue; settings and their revisions."""
from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from scrinalia.api import catalogue_view, views
from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, field_errors, not_found
from scrinalia.api.schemas import (
    SYSTEM_ERRORS,
    ErrorOut,
    RevisionsOut,
    RunConflictOut,
    RunOut,
    RunRequestIn,
    SettingsIn,
    SettingsOut,
    WorkerOut,
    WorkersOut,
)
from scrinalia.api.security import Principal, system_guard
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import InvalidRunRequest, WorkerRunAlreadyActive
from scrinalia.domains.archive.worker_settings import (
    SettingsRevisionConflict,
    delete_settings,
    get_settings,
    list_revisions,
    put_settings,
)
from scrinalia.domains.archive.workers.sdk import WorkerSpec

log = logging.getLogger("scrinalia.api.workers")
router = APIRouter(prefix="/workers", tags=["workers"])

WorkerName = Path(min_length=1, max_length=100, description="A worker of the catalogue")
_ERR = SYSTEM_ERRORS


def _spec(request: Request, name: str) -> WorkerSpec:
    spec = ctx(request).catalogue.get(name)
    if spec is None:
        raise not_found(f"worker {name!r}")
    return spec


def _request_dict(body: RunRequestIn) -> dict[str, Any]:
    return body.model_dump(exclude_unset=True, exclude={"expected_revision"})


def _settings_out(name: str, spec: WorkerSpec, engine, persisted: dict[str, Any] | None) -> dict[str, Any]:
    """``SettingsOut``: the persisted row and what a run would use now, secret-looking values masked,
    and the warnings of what is saved but may not run (``catalogue_view.settings_warnings``)."""
    effective, warnings = catalogue_view.effective_settings_and_warnings(spec, engine)
    return {
        "worker": name,
        "persisted": views.redact(persisted) if persisted else None,
        "effective": views.redact(effective),
        "warnings": warnings,
    }


@router.get("", response_model=WorkersOut, responses=_ERR,
            summary="Every worker: settings, counts, active and last run, runners, queued reason")
def list_workers(request: Request) -> dict[str, Any]:
    c = ctx(request)
    return views.workers_view(c.engine, c.catalogue, counts_cache=c.counts)


@router.get("/{name}", response_model=WorkerOut, responses=_ERR, summary="One worker, as in the list")
def get_worker(request: Request, name: str = WorkerName) -> dict[str, Any]:
    _spec(request, name)
    c = ctx(request)
    return views.workers_view(c.engine, c.catalogue, [name], counts_cache=c.counts)["workers"][0]


@router.post(
    "/{name}/runs",
    status_code=201,
    response_model=RunOut,
    responses={**_ERR,
               409: {"model": RunConflictOut, "description": "The worker's slot is taken; active_run holds it"}},
    summary="Enqueue a run (OPERATE): validated, written QUEUED through the ledger",
)
def enqueue_run(request: Request, body: RunRequestIn | None = None, name: str = WorkerName,
                principal: Principal = Depends(system_guard)) -> Any:
    c = ctx(request)
    spec = _spec(request, name)
    payload = _request_dict(body) if body is not None else {}
    try:
        clean = catalogue_view.validate_run_request(spec, c.engine, payload)
        run = ledger.enqueue(
            c.engine, name, clean, trigger=principal.trigger, requested_by=principal.label,
            requested_by_user_id=principal.user.id,
        )
    except InvalidRunRequest as exc:
        raise field_errors({exc.field: exc.message}) from None
    except WorkerRunAlreadyActive as exc:
        raise ApiError(409, "run_active", str(exc), active_run=views.run_json(exc.active)) from None
    log.info("enqueued run %s of %s (user %s)", run.run_id, name, principal.user.id)
    return JSONResponse(views.run_json(run), status_code=201, headers={"Location": f"/api/v1/system/runs/{run.run_id}"})


@router.get("/{name}/settings", response_model=SettingsOut, responses=_ERR, summary="Persisted and effective settings")
def read_settings(request: Request, name: str = WorkerName) -> dict[str, Any]:
    c = ctx(request)
    spec = _spec(request, name)
    return _settings_out(name, spec, c.engine, get_settings(c.engine, name))


@router.put("/{name}/settings", response_model=SettingsOut,
            responses={**_ERR, 409: {"model": ErrorOut, "description": "expected_revision does not match"}},
            summary="Replace the worker's persisted settings (OPERATE); writes a revision")
def write_settings(body: SettingsIn, request: Request, name: str = WorkerName,
                   principal: Principal = Depends(system_guard)) -> dict[str, Any]:
    c = ctx(request)
    spec = _spec(request, name)
    values = _request_dict(body)
    try:
        clean = catalogue_view.validate_settings(spec, c.engine, values)
        stored = put_settings(c.engine, name, clean, changed_by=principal.label,
                              expected_revision=body.expected_revision)
    except InvalidRunRequest as exc:
        raise field_errors({exc.field: exc.message}) from None
    except SettingsRevisionConflict as exc:
        raise ApiError(409, "revision_conflict", str(exc), revision=exc.actual) from None
    log.info("settings of %s replaced at revision %s (user %s)", name, stored["revision"], principal.user.id)
    return _settings_out(name, spec, c.engine, stored)


@router.delete("/{name}/settings", response_model=SettingsOut,
               responses={**_ERR, 409: {"model": ErrorOut}},
               summary="Remove the worker's persisted settings (OPERATE): back to its defaults; writes a revision")
def remove_settings(request: Request, name: str = WorkerName,
                    expected_revision: int | None = Query(default=None, ge=0, le=2**31 - 1),
                    principal: Principal = Depends(system_guard)) -> dict[str, Any]:
    c = ctx(request)
    spec = _spec(request, name)
    try:
        revision = delete_settings(c.engine, name, changed_by=principal.label, expected_revision=expected_revision)
    except SettingsRevisionConflict as exc:
        raise ApiError(409, "revision_conflict", str(exc), revision=exc.actual) from None
    if revision is None:
        raise not_found(f"persisted settings of worker {name!r}")
    log.info("settings of %s removed at revision %s (user %s)", name, revision, principal.user.id)
    return _settings_out(name, spec, c.engine, None)


@router.get("/{name}/settings/revisions", response_model=RevisionsOut, responses=_ERR,
            summary="The settings' revisions, newest first")
def settings_revisions(request: Request, name: str = WorkerName,
                       limit: int = Query(default=100, ge=1, le=1000)) -> dict[str, Any]:
    _spec(request, name)
    revisions = list_revisions(ctx(request).engine, name, limit=limit)
    return {"worker": name, "revisions": [{**r, "settings": views.redact(r["settings"])} for r in revisions]}
