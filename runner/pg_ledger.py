"""The production adapter of the ledger port: PostgreSQL, through today's functions and their SQL unchanged.

Each method is one call of ``scrinalia.domains.archive.ledger`` / ``registry`` / ``worker_settings`` / the
SDK's ``active_llm_check_rule`` on this adapter's engine, which sends the named query of the same name from
the statements' one home, ``scrinalia/domains/archive/queries.sql`` (docs/protocol.md).
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, Engine, RootTransaction

from runner import bounded as client_bounds
from scrinalia.db.engine import ServerFacts
from scrinalia.domains.archive import ledger, registry, worker_settings
from scrinalia.domains.archive.ledger import FinishParams, HeartbeatResult, StartParams, WorkerRun
from scrinalia.domains.archive.registry import RunnerRegistration
from scrinalia.domains.archive.workers import sdk


class PostgresBatch:
    """A child's batch on its own connection and transaction; ``connection`` is where the batch writes."""

    def __init__(self, engine: Engine, run_id: uuid.UUID, runner_id: uuid.UUID) -> None:
        self.run_id, self.runner_id = run_id, runner_id
        self.connection: Connection = engine.connect()
        self._transaction: RootTransaction = self.connection.begin()

    def register_fence(self) -> bool:
        return ledger.register_batch_fence(self.connection, self.run_id, self.runner_id)

    def commit(self) -> None:
        try:
            self._transaction.commit()
        finally:
            self.connection.close()

    def rollback(self) -> None:
        try:
            self._transaction.rollback()
        finally:
            self.connection.close()


class PostgresLedger:
    """``LedgerPort`` on a SQLAlchemy engine (the supervisor's ``parent_engine``, or any engine)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def bounded(self, deadline: float | None) -> AbstractContextManager[None]:
        return client_bounds.until(self.engine, deadline)

    # --- the queue ------------------------------------------------------------------------------------

    def enqueue(self, worker_name: str, request: Mapping[str, Any], **fields: Any) -> WorkerRun:
        return ledger.enqueue(self.engine, worker_name, request, **fields)

    def claim_next(self, runner_id: uuid.UUID, capabilities: Iterable[str], lease_seconds: float) -> WorkerRun | None:
        return ledger.claim_next(self.engine, runner_id, capabilities, lease_seconds)

    def create_running(
        self,
        worker_name: str,
        request: Mapping[str, Any],
        *,
        runner_id: uuid.UUID,
        lease_seconds: float,
        requested_by: str | None = None,
    ) -> WorkerRun:
        return ledger.create_running(self.engine, worker_name, request, runner_id=runner_id,
                                     lease_seconds=lease_seconds, requested_by=requested_by)

    def record_start(self, run_id: uuid.UUID, runner_id: uuid.UUID, params: StartParams) -> bool:
        return ledger.record_start(self.engine, run_id, runner_id, params)

    def heartbeat(
        self,
        runner_id: uuid.UUID,
        lease_seconds: float,
        *,
        progress: Mapping[Any, Mapping[str, Any]] | None = None,
        children: Sequence[Mapping[str, Any]] | None = None,
        warm: Mapping[str, Any] | None = None,
    ) -> HeartbeatResult:
        return ledger.heartbeat(self.engine, runner_id, lease_seconds, progress=progress, children=children,
                               warm=warm)

    def record_progress(self, runner_id: uuid.UUID, progress: Mapping[Any, Mapping[str, Any]]) -> int:
        return ledger.record_progress(self.engine, runner_id, progress)

    def finish(self, run_id: uuid.UUID, runner_id: uuid.UUID, params: FinishParams) -> WorkerRun | None:
        return ledger.finish(self.engine, run_id, runner_id, params)

    def expire_leases(self) -> list[WorkerRun]:
        return ledger.expire_leases(self.engine)

    def request_cancel(self, run_id: uuid.UUID, requested_by: str | None = None) -> WorkerRun:
        return ledger.request_cancel(self.engine, run_id, requested_by)

    # --- reads ------------------------------------------------------------------------------------------

    def get_run(self, run_id: uuid.UUID) -> WorkerRun | None:
        return ledger.get_run(self.engine, run_id)

    def active_run(self, worker_name: str) -> WorkerRun | None:
        return ledger.active_run(self.engine, worker_name)

    def worker_settings(self, worker_name: str) -> dict[str, Any] | None:
        return worker_settings.get_settings(self.engine, worker_name)

    def llm_check_rule(self) -> dict[str, Any] | None:
        return sdk.active_llm_check_rule(self.engine)

    def server_facts(self) -> ServerFacts | None:
        return ServerFacts.of(self.engine)

    # --- the registry -------------------------------------------------------------------------------

    def register(self, registration: RunnerRegistration) -> None:
        registry.register(self.engine, registration)

    def stop(self, runner_id: uuid.UUID) -> bool:
        return registry.stop(self.engine, runner_id)

    def request_drain(self, runner_id: uuid.UUID, requested_by: str | None = None) -> bool:
        return registry.request_drain(self.engine, runner_id, requested_by)

    # --- a child's batch ------------------------------------------------------------------------------

    def begin_batch(self, run_id: uuid.UUID, runner_id: uuid.UUID) -> PostgresBatch:
        return PostgresBatch(self.engine, run_id, runner_id)
