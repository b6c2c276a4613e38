"""The two worlds the conformance suite runs its tests in: a real PostgreSQL and the in-memory ledger.

A test receives a ``World``: the ledger port under test (``world.ledger``, a session with a short
``lock_timeout``), and what a test needs around it, the same on both sides: let time pass on the
database clock, hold a row lock as another session, persist settings, read the registry. Only these
few helpers differ by adapter; every assertion is shared.
"""
from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Engine, text

from runner.ledger_port import BatchTransaction, LedgerPort
from runner.memory_ledger import InMemoryBatch, MemoryDatabase
from runner.pg_ledger import PostgresBatch, PostgresLedger
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import registry, worker_settings
from scrinalia.domains.archive.registry import RunnerRegistration, RunnerRow

#: The session's lock_timeout on both sides (the supervisor's is 0.8 x statement_seconds; short here).
LOCK_TIMEOUT_S = 0.3


class World(Protocol):
    ledger: LedgerPort
    kind: str

    def elapsed(self) -> float:
        """Seconds of the database clock since the world began (wall time on PostgreSQL)."""
        ...

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass on the database clock."""
        ...

    def lock_row(self, run_id: uuid.UUID, mode: str, *, release_after_s: float | None = None
                 ) -> AbstractContextManager[None]:
        """Another session holds ``run_id``'s row ``FOR UPDATE`` / ``FOR SHARE`` inside the block (until
        ``release_after_s``, when given)."""
        ...

    def put_settings(self, worker_name: str, values: dict[str, Any]) -> None: ...

    def put_llm_check_rule(self, name: str, engine_name: str, engine_options: dict[str, Any], *,
                           prompt: str) -> None:
        """The API makes ``name`` the active LLM_CHECK cleaning rule."""
        ...

    def runner(self, runner_id: uuid.UUID) -> RunnerRow | None: ...

    def session(self, *, lock_timeout_s: float, idle_in_transaction_s: float | None = None) -> LedgerPort:
        """Another session on the same database (a child's, with its own bounds)."""
        ...

    def lock_in_batch(self, batch: BatchTransaction, run_id: uuid.UUID) -> None:
        """``SELECT ... FOR UPDATE`` of the run's row inside the batch's own transaction."""
        ...


def registration(capabilities: list[str], *, lease: float = 60.0, heartbeat: float = 1.0,
                 runner_id: uuid.UUID | None = None, sees: dict[str, Any] | None = None) -> RunnerRegistration:
    return RunnerRegistration(
        runner_id=runner_id or uuid.uuid4(), name="conformance", hostname=socket.gethostname(), pid=1,
        package_version="test", schema_revision=None, capabilities=capabilities, concurrency=1,
        heartbeat_seconds=heartbeat, lease_seconds=lease, devices=[{"index": 0, "name": "gpu"}],
        sees=sees or {},
    )


class PostgresWorld:
    kind = "postgres"

    def __init__(self, database_url: str) -> None:
        ms = int(LOCK_TIMEOUT_S * 1000)
        self.engine: Engine = create_engine_from_url(
            database_url, pool_size=2, max_overflow=4, connect_args={"options": f"-c lock_timeout={ms}"})
        # Another session's: bounded too, so a defect that leaves a row locked fails a test instead of hanging it.
        self.others: Engine = create_engine_from_url(database_url, pool_size=2, max_overflow=4,
                                                     connect_args={"options": "-c lock_timeout=5000"})
        self.ledger: LedgerPort = PostgresLedger(self.engine)
        self.url = database_url
        self._engines: list[Engine] = []
        self._started = time.monotonic()

    def close(self) -> None:
        for engine in (self.engine, self.others, *self._engines):
            engine.dispose()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @contextmanager
    def lock_row(self, run_id: uuid.UUID, mode: str, *, release_after_s: float | None = None) -> Iterator[None]:
        clause = {"update": "FOR UPDATE", "share": "FOR SHARE"}[mode]
        conn = self.others.connect()
        transaction = conn.begin()
        conn.execute(text(f"SELECT 1 FROM archive_worker_runs WHERE run_id = :r {clause}"), {"r": run_id})
        timer = threading.Timer(release_after_s, transaction.rollback) if release_after_s is not None else None
        if timer is not None:
            timer.start()
        try:
            yield
        finally:
            if timer is not None:
                timer.join()
            else:
                transaction.rollback()
            conn.close()

    def put_settings(self, worker_name: str, values: dict[str, Any]) -> None:
        worker_settings.put_settings(self.others, worker_name, values, changed_by="conformance")

    def put_llm_check_rule(self, name: str, engine_name: str, engine_options: dict[str, Any], *,
                           prompt: str) -> None:
        with self.others.begin() as conn:
            conn.execute(text("UPDATE archive_cleaning_rules SET active = false WHERE kind = 'LLM_CHECK'"))
            conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, engine_name, engine_options, "
                              "prompt) VALUES (:n, 'LLM_CHECK', 'title', :e, CAST(:o AS jsonb), :p)"),
                         {"n": name, "e": engine_name, "o": json.dumps(engine_options), "p": prompt})

    def runner(self, runner_id: uuid.UUID) -> RunnerRow | None:
        return registry.get_runner(self.others, runner_id)

    def session(self, *, lock_timeout_s: float, idle_in_transaction_s: float | None = None) -> LedgerPort:
        options = f"-c lock_timeout={int(lock_timeout_s * 1000)}"
        if idle_in_transaction_s is not None:
            options += f" -c idle_in_transaction_session_timeout={int(idle_in_transaction_s * 1000)}"
        engine = create_engine_from_url(self.url, pool_size=2, max_overflow=2, connect_args={"options": options})
        self._engines.append(engine)
        return PostgresLedger(engine)

    def lock_in_batch(self, batch: BatchTransaction, run_id: uuid.UUID) -> None:
        assert isinstance(batch, PostgresBatch)
        batch.connection.execute(text("SELECT 1 FROM archive_worker_runs WHERE run_id = :r FOR UPDATE"),
                                 {"r": run_id})


@dataclass
class VirtualClock:
    """The simulator's kind of clock: it moves only when told to."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class MemoryWorld:
    kind = "memory"

    def __init__(self) -> None:
        self.start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
        self.clock = VirtualClock(self.start)
        self.database = MemoryDatabase(self.clock, elapse=self.clock.advance)
        self.ledger: LedgerPort = self.database.session(lock_timeout_s=LOCK_TIMEOUT_S, name="conformance")

    def close(self) -> None:
        pass

    def elapsed(self) -> float:
        return (self.clock.now - self.start).total_seconds()

    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @contextmanager
    def lock_row(self, run_id: uuid.UUID, mode: str, *, release_after_s: float | None = None) -> Iterator[None]:
        lock = self.database.lock_row(run_id, mode, release_after_s=release_after_s)
        try:
            yield
        finally:
            lock.release()

    def put_settings(self, worker_name: str, values: dict[str, Any]) -> None:
        self.database.put_settings(worker_name, values, changed_by="conformance")

    def put_llm_check_rule(self, name: str, engine_name: str, engine_options: dict[str, Any], *,
                           prompt: str) -> None:
        self.database.put_llm_check_rule(name, engine_name, engine_options, prompt=prompt)

    def runner(self, runner_id: uuid.UUID) -> RunnerRow | None:
        return self.database.runner(runner_id)

    def session(self, *, lock_timeout_s: float, idle_in_transaction_s: float | None = None) -> LedgerPort:
        return self.database.session(lock_timeout_s=lock_timeout_s, idle_in_transaction_s=idle_in_transaction_s)

    def lock_in_batch(self, batch: BatchTransaction, run_id: uuid.UUID) -> None:
        assert isinstance(batch, InMemoryBatch) and batch.run_id == run_id
        batch.lock_row()
