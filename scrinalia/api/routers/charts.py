"""/api/v1/system/charts: the series the panel's charts draw (read-only, any role with a session).

Each answer is one indexed statement (``scrinalia.domains.archive.charts``); times are Unix seconds by
the database's clock, the unit uPlot's time axis takes as it is.
"""
from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from scrinalia.api.context import ctx
from scrinalia.api.errors import not_found
from scrinalia.api.schemas import SYSTEM_ERRORS
from scrinalia.domains.archive import charts, ledger, registry

router = APIRouter(prefix="/charts", tags=["charts"])
_ERR = SYSTEM_ERRORS

WindowName = Literal["24h", "7d"]


class RunPointOut(BaseModel):
    t: float = Field(description="Unix seconds (database clock) of the bucket's last sample")
    done: int | None = Field(description="Units done by then")
    total: int | None
    rate: float | None = Field(description="Units per second since the previous bucket")
    rss_bytes: int | None = Field(description="The child's resident memory (heartbeat cadence)")
    gpu_bytes: int | None = Field(description="The child's GPU memory, when the runner sees one")


class RunSeriesOut(BaseModel):
    run_id: uuid.UUID
    status: str
    unit: str | None = None
    points: list[RunPointOut]


class WorkerBucketOut(BaseModel):
    t: float = Field(description="Unix seconds of the bucket's start")
    success: int
    failed: int
    interrupted: int
    cancelled: int
    p50_ms: float | None = Field(description="Median duration of the bucket's successful runs")
    p95_ms: float | None


class WorkerTrendOut(BaseModel):
    worker: str
    window: WindowName
    since: str = Field(description="The window's start (ISO 8601): runs finished from then on are counted")
    until: str
    step_seconds: float
    buckets: list[WorkerBucketOut]


class RunnerBucketOut(BaseModel):
    t: float
    busy: float = Field(description="Average slots busy over the bucket")


class RunnerSlotsOut(BaseModel):
    runner_id: uuid.UUID
    window: WindowName
    concurrency: int | None
    since: str
    until: str
    step_seconds: float
    buckets: list[RunnerBucketOut]


@router.get("/runs/{run_id}", response_model=RunSeriesOut, responses=_ERR,
            summary="A run's units/s and memory over its life (at most 600 points)")
def run_series(run_id: uuid.UUID, request: Request,
               points: int = Query(default=300, ge=10, le=charts.MAX_POINTS)) -> dict[str, Any]:
    engine = ctx(request).engine
    run = ledger.get_run(engine, run_id)
    if run is None:
        raise not_found(f"run {run_id}")
    unit = run.progress.get("unit") if isinstance(run.progress, dict) else None
    return {"run_id": run.run_id, "status": run.status, "unit": unit if isinstance(unit, str) else None,
            "points": charts.run_series(engine, run_id, points)}


@router.get("/workers/{name}", response_model=WorkerTrendOut, responses=_ERR,
            summary="A worker's finished runs per hour by outcome and p50/p95 durations, over 24 h or 7 d")
def worker_trend(request: Request,
                 name: str = Path(min_length=1, max_length=100, description="A worker of the catalogue"),
                 window: WindowName = Query(default="24h")) -> dict[str, Any]:
    c = ctx(request)
    if name not in c.catalogue:
        raise not_found(f"worker {name}")
    trend = charts.worker_trend(c.engine, name, charts.WINDOWS[window])
    return {"worker": name, "window": window, "since": trend.since.isoformat(), "until": trend.until.isoformat(),
            "step_seconds": trend.step_seconds, "buckets": trend.buckets}


@router.get("/runners/{runner_id}", response_model=RunnerSlotsOut, responses=_ERR,
            summary="A runner's busy slots over time (average per bucket), over 24 h or 7 d")
def runner_slots(runner_id: uuid.UUID, request: Request, window: WindowName = Query(default="24h")) -> dict[str, Any]:
    engine = ctx(request).engine
    if registry.get_runner(engine, runner_id) is None:
        raise not_found(f"runner {runner_id}")
    trend, concurrency = charts.runner_slots(engine, runner_id, charts.RUNNER_WINDOWS[window])
    return {"runner_id": runner_id, "window": window, "concurrency": concurrency,
            "since": trend.since.isoformat(), "until": trend.until.isoformat(),
            "step_seconds": trend.step_seconds, "buckets": trend.buckets}
