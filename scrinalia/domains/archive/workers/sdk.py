"""The worker SDK: what a worker declares (``WorkerSpec``) and what it receives (``RunContext``).

Contract between the runner (``runner/``) and the catalogue (``scrinalia.domains.archive.workers``):

* the runner finds workers through the plugin registry (``plugins.load_catalogue``: the entry-point
  group ``scrinalia.workers``, each entry point naming a ``WorkerSpec``);
* at claim the child re-resolves the request with ``spec.resolve(...)`` (explicit > persisted settings >
  signature default) and the parent's ledger ``record_start`` writes what it returns;
* the child builds a ``RunContext`` and calls ``spec.run(ctx)``; the worker's summary (a JSON object)
  is the run's ``result``. ``RunCancelled`` ends the run CANCELLED, ``LeaseLost`` ends the child with
  nothing more written, any other exception ends it FAILED.

A worker never writes to the archive outside ``RunContext.commit``: that is the hard fence (the run's
lease is checked in the same transaction, so no late write lands after the lease is gone).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import UUID

from scrinalia.domains.archive.ledger import WorkerRun

T = TypeVar("T")


class RunCancelled(Exception):
    """Raised at a batch boundary when cancellation was requested; the run ends CANCELLED."""


class LeaseLost(Exception):
    """The run's lease is gone: the batch was rolled back and the child must stop writing."""


class ChildChannel(Protocol):
    """How a RunContext talks to whoever supervises the child (the daemon's parent or the one-shot CLI)."""

    def send_progress(self, progress: Mapping[str, Any]) -> None: ...

    def cancel_requested(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """The effective configuration of one run: what record_start writes as the truth."""

    engine_name: str | None
    preset: str | None
    db_batch_size: int
    options: dict[str, Any]
    engine_options: dict[str, Any]
    config: dict[str, Any]  # the engine's describe_config(): what would be loaded, made without loading it


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker's declaration. ``run`` must be a module-level function so a fork server can import it."""

    name: str
    label: str
    description: str
    run: Callable[["RunContext"], Mapping[str, Any] | None]
    unit: str = "document"
    governed: bool = False
    engine_source: str = "none"  # "none" | "settings" | "llm_check_rule"
    stamp_key: str | None = None
    default_batch_size: int = 32
    options: Mapping[str, Any] = field(default_factory=dict)  # name -> OptionSpec (catalogue)
    accepts_extra_options: bool = False
    requires: tuple[str, ...] = ()  # e.g. ("gpu",)
    resolver: Callable[..., ResolvedConfig] | None = None

    def resolve(self, engine: Engine, request: Mapping[str, Any]) -> ResolvedConfig:
        """Re-resolve the request against persisted settings and defaults (explicit > persisted > default)."""
        if self.resolver is not None:
            return self.resolver(self, engine, request)
        return ResolvedConfig(
            engine_name=request.get("engine_name"),
            preset=request.get("preset"),
            db_batch_size=int(request.get("db_batch_size") or self.default_batch_size),
            options=dict(request.get("options") or {}),
            engine_options=dict(request.get("engine_options") or {}),
            config={},
        )


_LEASE_FENCE = text(
    """
    SELECT 1 FROM archive_worker_runs
     WHERE run_id = :run_id AND runner_id = :runner_id AND status = 'RUNNING' AND lease_expires_at > now()
       FOR UPDATE
    """
).bindparams(bindparam("run_id", type_=UUID(as_uuid=True)), bindparam("runner_id", type_=UUID(as_uuid=True)))


class RunContext:
    """Everything a worker receives: the run, its effective config, the database, progress and the fence."""

    def __init__(
        self,
        run: WorkerRun,
        config: ResolvedConfig,
        engine: Engine,
        channel: ChildChannel,
    ) -> None:
        if run.runner_id is None:
            raise ValueError("a RunContext needs a claimed run (runner_id is set)")
        self.run = run
        self.config = config
        self.engine = engine
        self.channel = channel
        self.runner_id: uuid.UUID = run.runner_id
        self.result: dict[str, Any] = {}
        self.done = 0
        self.total: int | None = None

    def cancelled(self) -> bool:
        return self.channel.cancel_requested()

    def report_progress(self, done: int, total: int | None = None, unit: str | None = None, **extra: Any) -> None:
        self.done, self.total = done, total if total is not None else self.total
        self.channel.send_progress({"done": done, "total": self.total, "unit": unit or "unit", **extra})

    def commit(self, write: Callable[[Connection], T]) -> T:
        """Run ``write`` in one transaction that first locks this run's row and checks its lease.

        If the lease is gone the transaction is rolled back and ``LeaseLost`` is raised, so no archive
        write lands after another runner may have taken over.
        """
        with self.engine.begin() as conn:
            held = conn.execute(_LEASE_FENCE, {"run_id": self.run.run_id, "runner_id": self.runner_id}).first()
            if held is None:
                raise LeaseLost(f"run {self.run.run_id} is no longer held by runner {self.runner_id}")
            return write(conn)

    def batches(self, fetch: Callable[[Connection, int], list[T]]) -> Iterator[list[T]]:
        """Yield batches of at most ``db_batch_size`` pending units until ``fetch`` returns none.

        The cancellation check lives here, once per batch boundary, so no worker can forget it.
        """
        size = self.config.db_batch_size
        while True:
            if self.cancelled():
                raise RunCancelled(f"cancelled after {self.done} units")
            with self.engine.connect() as conn:
                batch = fetch(conn, size)
            if not batch:
                return
            yield batch
