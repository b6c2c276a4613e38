"""A child's batch on the in-memory ledger: one transaction, fenced at registration and at COMMIT."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from runner.memory_ledger.errors import fence_refusal, unreachable_error, wrap_error
from runner.memory_ledger.locks import SHARE, UPDATE, RowLock
from runner.memory_ledger.twins import statement
from runner.memory_ledger.values import seconds
from scrinalia.domains.archive import ledger

if TYPE_CHECKING:
    from runner.memory_ledger.session import InMemoryLedger


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """A batch whose COMMIT the fence let through: the simulator's "no batch after its lease" evidence."""

    run_id: uuid.UUID
    runner_id: uuid.UUID
    committed_at: datetime
    lease_expires_at: datetime
    payload: Any = None



class InMemoryBatch:
    """A child's batch on the in-memory ledger (``BatchTransaction``): one transaction of its session.

    As in PostgreSQL, the transaction ends with its session: ``InMemoryLedger.close`` (the child died, its
    connection closed) rolls it back, ``MemoryDatabase.restart`` breaks it (its next statement fails
    ``unreachable``), and a session's ``idle_in_transaction_s`` ends it once it has been idle that long
    (decision 0101: its next statement fails ``blocked``, SQLSTATE 25P03). Row locks it takes
    (``lock_row``) last as long as it does, and never block its own statements."""

    def __init__(self, session: InMemoryLedger, run_id: uuid.UUID, runner_id: uuid.UUID) -> None:
        self.session, self.run_id, self.runner_id = session, run_id, runner_id
        self.fenced = False
        self.open = True
        self.payload: list[Any] = []  # what the batch wrote, kept with it at COMMIT
        self.locks: list[RowLock] = []
        self._generation = session.db.generation
        self._last_active = session.db.now()
        session.batches.append(self)

    @property
    def idle_deadline(self) -> datetime | None:
        """When the server ends this transaction if it stays idle (None: never)."""
        idle = self.session.idle_in_transaction_s
        return None if idle is None else self._last_active + seconds(idle)

    @statement("register_batch_fence")
    def register_fence(self) -> bool:
        """The INSERT ... WHERE EXISTS (held by me, RUNNING, lease_expires_at > clock_timestamp())."""
        with self.session._statement("register_batch_fence"):
            now = self._active("register_batch_fence")
            if self._held(now) is None:
                return False
            self.fenced = True
            return True

    def write(self, payload: Any = None) -> None:
        """One of the batch's own writes (the worker's rows): kept with the batch if it commits."""
        with self.session._statement("write"):
            self._active("write")
            self.payload.append(payload)

    def lock_row(self, mode: str = UPDATE) -> RowLock:
        """``SELECT ... FOR UPDATE`` / ``FOR SHARE`` of the run's row inside this transaction, held until it
        ends (what the batch fence did before migration 0008: a simulator's mutant uses it)."""
        with self.session._statement("lock_row"):
            self._active("lock_row")
            lock = self.session.db.lock_row(self.run_id, mode, owner=self)
            self.locks.append(lock)
            return lock

    def commit(self) -> None:
        """The deferred trigger of migration 0008: FOR SHARE on the run's row (its own 2 s lock_timeout),
        then RUNNING, held by this runner, lease_expires_at > clock_timestamp(); else SF001."""
        with self.session._statement("commit"):
            now = self._active("commit")
            try:
                if self.fenced:
                    self._check_fence(now)
            finally:
                self._end()

    def _check_fence(self, now: datetime) -> None:
        db = self.session.db
        row = db.by_run_id.get(self.run_id)
        if row is not None:
            now = db._acquire("commit", row, SHARE, ledger.BATCH_FENCE_LOCK_TIMEOUT_S, now, owner=self)
        held = self._held(now)
        if held is None:
            status = row["status"] if row is not None else "unknown"
            until = row["lease_expires_at"] if row is not None else None
            raise fence_refusal("commit", f"LeaseLost: run {self.run_id} is not held by runner "
                                 f"{self.runner_id} at commit (status {status}, lease until "
                                 f"{until if until is not None else 'none'}, now {now})")
        db.committed_batches.append(CommittedBatch(self.run_id, self.runner_id, now,
                                                   held["lease_expires_at"], tuple(self.payload)))

    def rollback(self) -> None:
        if self.open:
            self._end()

    def _active(self, what: str) -> datetime:
        """The transaction is still there (else the error its next statement gets); it was active now."""
        if not self.open:
            raise RuntimeError("this batch's transaction is over")
        db = self.session.db
        now = db.now()
        if db.generation != self._generation:
            self._end()
            raise unreachable_error(what, "server closed the connection unexpectedly")
        deadline = self.idle_deadline
        if deadline is not None and now > deadline:
            self._end()
            raise wrap_error(what, psycopg.errors.IdleInTransactionSessionTimeout(
                "terminating connection due to idle-in-transaction timeout"), invalidated=True)
        self._last_active = now
        for lock in self.locks:
            lock.release_at = self.idle_deadline
        return now

    def _end(self) -> None:
        self.open = False
        for lock in self.locks:
            lock.release()
        self.locks.clear()
        if self in self.session.batches:
            self.session.batches.remove(self)

    def _held(self, now: datetime) -> dict[str, Any] | None:
        row = self.session.db.by_run_id.get(self.run_id)
        if (row is None or row["status"] != "RUNNING" or row["runner_id"] != self.runner_id
                or row["lease_expires_at"] is None or row["lease_expires_at"] <= now):
            return None
        return row
