"""Running a worker in the tests.

``run_worker`` goes through a REAL runner child (``runner.oneshot.run_once``: the same child entry point
as the daemon) when it is installed. ``run_in_process`` drives the SDK directly with an in-test
ChildChannel, for the tests that must act at a precise batch boundary (cancellation, the fence).
"""
from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from runner.oneshot import run_once
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import FinishParams, StartParams
from scrinalia.domains.archive.workers.sdk import LeaseLost, LocalChannel, RunCancelled, RunContext, WorkerSpec


def insert_docs(engine: Engine, docs: list[dict[str, Any]]) -> list[int]:
    ids = []
    with engine.begin() as conn:
        for doc in docs:
            row = {"reference_code": doc.get("reference_code", f"T/{uuid.uuid4().hex[:10]}"), "title": "",
                   "status": "DRAFT", **doc}
            cols = ", ".join(row)
            vals = ", ".join(f"CAST(:{k} AS document_status)" if k == "status" else f":{k}" for k in row)
            ids.append(conn.execute(text(f"INSERT INTO archive_documents ({cols}) VALUES ({vals}) RETURNING id"),
                                    row).scalar_one())
    return ids


def register_runner(engine: Engine, capabilities: list[str]) -> uuid.UUID:
    runner_id = uuid.uuid4()
    registry.register(engine, registry.RunnerRegistration(
        runner_id=runner_id, name="test", hostname=socket.gethostname(), pid=os.getpid(), package_version="test",
        schema_revision=None, capabilities=capabilities, concurrency=1, heartbeat_seconds=5.0,
        lease_seconds=60.0, kind="cli"))
    return runner_id


class HookChannel(LocalChannel):
    """Calls ``on_progress(progress, channel)`` on every progress report (after each committed batch)."""

    def __init__(self, on_progress: Callable[[dict[str, Any], HookChannel], None] | None = None) -> None:
        super().__init__()
        self.on_progress = on_progress

    def send_progress(self, progress):
        super().send_progress(progress)
        if self.on_progress is not None:
            self.on_progress(dict(progress), self)


def run_in_process(engine: Engine, spec: WorkerSpec, request: dict[str, Any] | None = None,
                   channel: LocalChannel | None = None) -> tuple[str, dict[str, Any], ledger.WorkerRun]:
    """What a child does, in this process: resolve, record_start, RunContext, run, finish."""
    request = request or {}
    runner_id = register_runner(engine, [spec.name])
    run = ledger.create_running(engine, spec.name, request, runner_id=runner_id, lease_seconds=60)
    resolved = spec.resolve(engine, request)
    assert ledger.record_start(engine, run.run_id, runner_id, StartParams(engine_name=resolved.engine_name,
                               preset=resolved.preset, config=resolved.config, options=resolved.options))
    ctx = RunContext(run, resolved, engine, channel or LocalChannel())
    status, result = "SUCCESS", None
    try:
        result = dict(spec.run(ctx) or ctx.result)
    except RunCancelled:
        status, result = "CANCELLED", dict(ctx.result)
    except LeaseLost:
        lost = ledger.get_run(engine, run.run_id)
        assert lost is not None
        return "LEASE_LOST", dict(ctx.result), lost
    final = ledger.finish(engine, run.run_id, runner_id, FinishParams(status, result=result,
                          exit_reason="cancelled" if status == "CANCELLED" else None))
    assert final is not None
    return status, result, final


def run_worker(database_url: str, engine: Engine, spec: WorkerSpec, request: dict[str, Any] | None = None
               ) -> tuple[str, dict[str, Any], ledger.WorkerRun]:
    """Through a real runner child: ``runner.oneshot.run_once``, the daemon's child entry point."""
    run = run_once(database_url, spec.name, request or {}, requested_by="tests")
    assert run.trigger == "CLI" and run.metrics and "start_method" in run.metrics, run  # a real child ran it
    return run.status, dict(run.result or {}), run


def stamps(engine: Engine, key: str) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT reference_code, execution_log -> CAST(:k AS text) AS s "
                                 "FROM archive_documents ORDER BY id"), {"k": key}).all()
    return {r.reference_code: r.s for r in rows}


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params).all())
