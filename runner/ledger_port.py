"""The ledger port: every protocol statement the supervisor, the one-shot CLI and a child's batch send.

The supervisor talks to the ledger only through this interface, so that the same production classes run
against PostgreSQL (``runner.pg_ledger.PostgresLedger``: today's functions of
``scrinalia.domains.archive.ledger`` and ``registry``, their SQL unchanged) and against the in-memory
ledger of the deterministic simulator (``runner.memory_ledger.InMemoryLedger``), which keeps
PostgreSQL's semantics for these statements (the slot index, ``SKIP LOCKED``, the database clock, leases
and expiry, the fence at commit, row locks and ``lock_timeout``). One conformance suite
(``tests/ledger/test_conformance.py``) holds both adapters to the same tests.

Both adapters fail the same way, so a caller cannot tell them apart: a statement the database refused or
did not answer raises a SQLAlchemy ``DBAPIError`` wrapping a psycopg error, which
``scrinalia.db.errors.classify_database_error`` names ``blocked`` (a lock wait past ``lock_timeout``:
SQLSTATE 55P03), ``unreachable`` or ``error``; a batch refused at COMMIT carries SQLSTATE
``ledger.BATCH_FENCE_SQLSTATE`` (``ledger.is_batch_fence_refusal``: the SDK's ``LeaseLost``); a second
active row for a worker is ``WorkerRunAlreadyActive``; ``request_cancel`` of an unknown or finished run
is ``RunNotFound`` / ``RunAlreadyFinished``.

A fenced statement that touches no row means the caller lost that run (docs/protocol.md): ``record_start``
False, ``finish`` None, a heartbeat's ``held`` without it, ``register_fence`` False.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from scrinalia.db.engine import ServerFacts
from scrinalia.domains.archive.ledger import FinishParams, HeartbeatResult, StartParams, WorkerRun
from scrinalia.domains.archive.registry import RunnerRegistration


class BatchTransaction(Protocol):
    """One batch of a child's run: its own transaction, fenced by the run's lease at COMMIT (decision 0100).

    ``register_fence`` is the transaction's first statement: False when the lease is already gone (write
    nothing, roll back: the SDK's ``LeaseLost``). ``commit`` checks the lease again, with the database
    clock at that instant; past the lease (or the run not RUNNING, or held by another runner) it raises a
    ``DBAPIError`` whose SQLSTATE is ``BATCH_FENCE_SQLSTATE`` and nothing of the batch is kept. The check
    takes the run's row ``FOR SHARE`` with migration 0008's own lock_timeout (2 s): a session holding the
    row ``FOR UPDATE`` makes the COMMIT fail ``blocked`` instead."""

    def register_fence(self) -> bool: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


class LedgerPort(Protocol):
    """The protocol statements (docs/protocol.md), each one statement on the database clock, fenced.

    Each method is the named query of ``scrinalia/domains/archive/queries.sql`` of the same name (the batch's
    ``register_fence``: ``register_batch_fence``; ``server_facts`` sends nothing: it is what the session's
    first connection learned). Signatures mirror ``scrinalia.domains.archive.ledger`` / ``registry`` /
    ``worker_settings`` without their first argument (the engine is the adapter's); a step with many
    fields takes the ledger's parameter object (``FinishParams``, ``StartParams``)."""

    def bounded(self, deadline: float | None) -> AbstractContextManager[None]:
        """Every statement sent inside ends by ``deadline`` (CLOCK_MONOTONIC; None: the statement bound
        alone): ``runner.bounded.until`` in production (decision 0110). A statement still unanswered
        then fails ``unreachable``."""
        ...

    # --- the queue ------------------------------------------------------------------------------------

    def enqueue(
        self,
        worker_name: str,
        request: Mapping[str, Any],
        *,
        trigger: str = "API",
        requested_by: str | None = None,
        requested_by_user_id: int | None = None,
        attempt: int = 1,
        retry_of: uuid.UUID | None = None,
        not_before_delay_s: float | None = None,
        schedule_id: int | None = None,
    ) -> WorkerRun:
        """A QUEUED row; ``WorkerRunAlreadyActive`` when the worker's slot is taken."""
        ...

    def claim_next(self, runner_id: uuid.UUID, capabilities: Iterable[str], lease_seconds: float) -> WorkerRun | None:
        """The oldest eligible QUEUED row (queued_at, id) among ``capabilities``, not before its
        ``not_before``, skipping rows another session has locked; RUNNING under ``runner_id``, or None."""
        ...

    def create_running(
        self,
        worker_name: str,
        request: Mapping[str, Any],
        *,
        runner_id: uuid.UUID,
        lease_seconds: float,
        requested_by: str | None = None,
    ) -> WorkerRun:
        """The one-shot CLI's claim: a row inserted already RUNNING (the slot index applies)."""
        ...

    def record_start(self, run_id: uuid.UUID, runner_id: uuid.UUID, params: StartParams) -> bool:
        """What actually runs; False when the row is not this runner's RUNNING row any more."""
        ...

    def heartbeat(
        self,
        runner_id: uuid.UUID,
        lease_seconds: float,
        *,
        progress: Mapping[Any, Mapping[str, Any]] | None = None,
        children: Sequence[Mapping[str, Any]] | None = None,
        warm: Mapping[str, Any] | None = None,
    ) -> HeartbeatResult:
        """The registry row and every RUNNING row of this runner renewed; what it holds, with the cancel
        requests, the drain request and the database's now."""
        ...

    def record_progress(self, runner_id: uuid.UUID, progress: Mapping[Any, Mapping[str, Any]]) -> int:
        """The changed progress of this runner's RUNNING rows; the rows changed."""
        ...

    def finish(self, run_id: uuid.UUID, runner_id: uuid.UUID, params: FinishParams) -> WorkerRun | None:
        """The terminal row; None when this runner does not hold it RUNNING any more."""
        ...

    def expire_leases(self) -> list[WorkerRun]:
        """Every RUNNING row past its lease -> INTERRUPTED ``lease-lost`` (a locked row is skipped)."""
        ...

    def request_cancel(self, run_id: uuid.UUID, requested_by: str | None = None) -> WorkerRun:
        """QUEUED -> CANCELLED at once; RUNNING -> ``cancel_requested_at`` (the first request wins)."""
        ...

    # --- reads ------------------------------------------------------------------------------------------

    def get_run(self, run_id: uuid.UUID) -> WorkerRun | None: ...

    def active_run(self, worker_name: str) -> WorkerRun | None: ...

    def worker_settings(self, worker_name: str) -> dict[str, Any] | None:
        """The persisted settings row the resolver's ``DatabaseLayer`` is built from at claim
        (``worker_settings.get_settings``), or None."""
        ...

    def llm_check_rule(self) -> dict[str, Any] | None:
        """The active LLM_CHECK cleaning rule an ``llm_check_rule`` worker takes its engine from, read at
        claim (``sdk.active_llm_check_rule``: ``updated_at`` as ISO text), or None."""
        ...

    def server_facts(self) -> ServerFacts | None:
        """What the database told this session's first connection (``ServerFacts``: the server's version,
        the schema, the isolation level), handed to a child so its engine asks nothing (decision 0073);
        None before the first statement."""
        ...

    # --- the registry -------------------------------------------------------------------------------

    def register(self, registration: RunnerRegistration) -> None: ...

    def stop(self, runner_id: uuid.UUID) -> bool:
        """The registry row marked stopped; False when it was unknown or stopped already."""
        ...

    def request_drain(self, runner_id: uuid.UUID, requested_by: str | None = None) -> bool:
        """The API's drain request (the runner learns it from its next heartbeat); False for an unknown or
        stopped runner."""
        ...

    # --- a child's batch ------------------------------------------------------------------------------

    def begin_batch(self, run_id: uuid.UUID, runner_id: uuid.UUID) -> BatchTransaction:
        """A batch transaction of ``run_id`` held by ``runner_id`` (nothing sent yet)."""
        ...
