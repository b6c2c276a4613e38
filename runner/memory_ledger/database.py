"""``MemoryDatabase``: the rows, the registry, the settings, the row locks and the clock every session shares."""
from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from runner.memory_ledger.errors import blocked_error, integrity_error
from runner.memory_ledger.locks import SHARE, UPDATE, RowLock
from runner.memory_ledger.values import jsonb, seconds
from scrinalia.domains.archive.errors import WorkerRunAlreadyActive
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.registry import RunnerRow

if TYPE_CHECKING:
    from runner.memory_ledger.batch import CommittedBatch, InMemoryBatch
    from runner.memory_ledger.session import InMemoryLedger, StatementFaults

Clock = Callable[[], datetime]

_RUN_FIELDS = tuple(f.name for f in fields(WorkerRun))


@dataclass(eq=False)
class MemoryDatabase:
    """The rows and the clock every session of the in-memory ledger shares.

    ``clock``: the database's now (an aware datetime). ``elapse``: called with the seconds a statement
    spent waiting on a row lock, so the world's clock moves on by that much (None: waits take no time).
    """

    clock: Clock
    elapse: Callable[[float], None] | None = None
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    by_run_id: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    by_text: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id::text, as jsonb keys name rows
    runners: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    configured: set[uuid.UUID] = field(default_factory=set)  # archive_worker_run_configs' keys (0022)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    llm_check_rule: dict[str, Any] | None = None  # the active LLM_CHECK cleaning rule (the API's write)
    locks: dict[uuid.UUID, list[RowLock]] = field(default_factory=dict)
    committed_batches: list[CommittedBatch] = field(default_factory=list)
    statements: int = 0
    generation: int = 0  # bumped by a restart: the transactions of the generation before are gone
    # The indexes the statements read (PostgreSQL's, in spirit): the slot, and each runner's RUNNING rows.
    _slot: dict[str, dict[str, Any]] = field(default_factory=dict)
    _running_by_runner: dict[uuid.UUID, dict[uuid.UUID, dict[str, Any]]] = field(default_factory=dict)
    _next_id: int = 1

    def now(self) -> datetime:
        moment = self.clock()
        if moment.tzinfo is UTC:
            return moment
        if moment.tzinfo is None:
            raise ValueError("the in-memory ledger's clock must return aware datetimes")
        return moment.astimezone(UTC)

    def session(self, *, lock_timeout_s: float, name: str = "session", faults: StatementFaults | None = None,
                idle_in_transaction_s: float | None = None) -> InMemoryLedger:
        from runner.memory_ledger.session import InMemoryLedger  # the session module builds on this one

        return InMemoryLedger(self, lock_timeout_s=lock_timeout_s, name=name, faults=faults,
                              idle_in_transaction_s=idle_in_transaction_s)

    # --- row locks of other sessions -------------------------------------------------------------------

    def lock_row(self, run_id: uuid.UUID, mode: str = UPDATE, *, release_after_s: float | None = None,
                 owner: InMemoryBatch | None = None) -> RowLock:
        """Take ``run_id``'s row lock as another session would (``SELECT ... FOR UPDATE`` / ``FOR SHARE``
        in a transaction left open) and hold it until ``release()`` (or ``release_after_s`` of the
        database clock; or, for a batch's own lock, until its transaction ends). Locks of other sessions
        do not conflict with each other here (the world's frozen sessions are not waited on by the
        world). Raises ``KeyError`` for an unknown run."""
        if mode not in (SHARE, UPDATE):
            raise ValueError(f"a row lock is {SHARE!r} or {UPDATE!r}, not {mode!r}")
        if run_id not in self.by_run_id:
            raise KeyError(run_id)
        release_at = None if release_after_s is None else self.now() + seconds(release_after_s)
        lock = RowLock(self, run_id, mode, release_at, owner)
        if owner is not None:
            lock.release_at = owner.idle_deadline
        self.locks.setdefault(run_id, []).append(lock)
        return lock

    def restart(self) -> None:
        """The server restarts (or fails over): every session's connection breaks, so every open
        transaction is gone and every row lock with it; committed rows stay (synchronous replication)."""
        self.generation += 1
        self.locks.clear()

    def _locked(self, run_id: uuid.UUID, wanted: str, now: datetime,
                owner: InMemoryBatch | None = None) -> list[RowLock]:
        held = self.locks.get(run_id)
        if not held:
            return []
        for lock in [lock for lock in held if lock.release_at is not None and lock.release_at <= now]:
            lock.release()
        return [lock for lock in self.locks.get(run_id, ())
                if lock.conflicts(wanted) and (owner is None or lock.owner is not owner)]

    def _acquire(self, what: str, row: Mapping[str, Any], wanted: str, bound: float, now: datetime,
                 owner: InMemoryBatch | None = None) -> datetime:
        """Wait for a row another session holds, as PostgreSQL does: until it is released, at most ``bound``
        seconds, then 55P03. Returns the clock after the wait.

        The wait is charged through ``elapse`` in slices (at most a quarter of the bound, or up to the
        locks' known release), re-checking the locks after each: an ``elapse`` that lets other actors run
        (the simulator's) sees a lock released meanwhile within a slice of its release. Without a clock
        that moves, a lock whose release time comes within the bound counts as released, any other fails
        the statement at once, with ``waited_seconds`` = the bound."""
        run_id = row["run_id"]
        started = now
        until = started + seconds(bound)
        slice_ = seconds(bound / 4)
        while True:
            conflicting = self._locked(run_id, wanted, now, owner)
            if not conflicting:
                return now
            if now >= until:
                raise blocked_error(what, (now - started).total_seconds())
            known = _known_release(conflicting)
            wake = min(until, now + slice_, *([known] if known is not None else []))
            self._charge((wake - now).total_seconds())
            after = self.now()
            if after <= now:  # the clock does not move: decide at once
                return self._decide_at_once(what, conflicting, known, until, bound, now)
            now = after

    @staticmethod
    def _decide_at_once(what: str, conflicting: list[RowLock], known: datetime | None, until: datetime,
                        bound: float, now: datetime) -> datetime:
        """A wait on a clock that does not move: the locks' known release within the bound counts as
        come, anything else is the lock_timeout at once."""
        if known is not None and known <= until:
            for lock in conflicting:
                lock.release()
            return now
        raise blocked_error(what, bound)

    def _charge(self, seconds: float) -> None:
        if self.elapse is not None and seconds > 0:
            self.elapse(seconds)

    # --- the world's own writes (the API's side) ---------------------------------------------------------

    def put_settings(self, worker_name: str, values: Mapping[str, Any], *, changed_by: str | None = None) -> None:
        """A worker's persisted settings (``worker_settings.put_settings``, already validated)."""
        current = self.settings.get(worker_name)
        self.settings[worker_name] = {
            "worker_name": worker_name,
            **{k: values.get(k) for k in ("engine_name", "preset", "db_batch_size")},
            "options": jsonb(dict(values.get("options") or {})),
            "engine_options": jsonb(dict(values.get("engine_options") or {})),
            "revision": (current["revision"] if current else 0) + 1,
            "updated_at": self.now().isoformat(),
            "updated_by": changed_by,
        }

    def put_llm_check_rule(self, name: str, engine_name: str, engine_options: Mapping[str, Any], *,
                           prompt: str, field: str = "title") -> None:
        """The API makes ``name`` the active LLM_CHECK cleaning rule (one at a time, as the partial unique
        index ``uq_cleaning_rule_active_llm_check`` has it)."""
        previous = self.llm_check_rule
        self.llm_check_rule = {"id": (previous["id"] + 1) if previous else 1, "name": name,
                               "engine_name": engine_name, "engine_options": jsonb(dict(engine_options)),
                               "prompt": prompt, "field": field, "updated_at": self.now().isoformat()}

    def runner(self, runner_id: uuid.UUID) -> RunnerRow | None:
        """The registry row, with its state by the database clock (``registry.get_runner``)."""
        row = self.runners.get(runner_id)
        if row is None:
            return None
        now = self.now()
        if row["stopped_at"] is not None:
            state = "stopped"
        elif row["last_heartbeat_at"] + seconds(row["lease_seconds"]) >= now:
            state = "online"
        else:
            state = "stale"
        return RunnerRow(**row, state=state)

    def digest(self) -> str:
        """A fingerprint of the whole world (every run, runner, committed batch), in insertion order: two
        histories that end in the same state give the same digest (the simulator's "same seed, same
        history" check)."""
        state = (list(self.runs.values()), list(self.runners.values()), self.committed_batches)
        return hashlib.sha256(repr(state).encode()).hexdigest()

    def active_runs(self) -> list[WorkerRun]:
        """Every QUEUED or RUNNING row (the slot index's content), for the simulator's invariants."""
        return [WorkerRun(**row) for row in self._slot.values()]

    # --- rows -------------------------------------------------------------------------------------------

    def _insert(self, what: str, values: dict[str, Any], now: datetime) -> dict[str, Any]:
        worker = values["worker_name"]
        if worker in self._slot:
            raise WorkerRunAlreadyActive(worker, WorkerRun(**self._slot[worker]))
        if values.get("runner_id") is not None and values["runner_id"] not in self.runners:
            raise integrity_error(what, psycopg.errors.ForeignKeyViolation,
                                   'insert or update on table "archive_worker_runs" violates foreign key '
                                   'constraint "archive_worker_runs_runner_id_fkey"')
        if values.get("retry_of") is not None and values["retry_of"] not in self.by_run_id:
            raise integrity_error(what, psycopg.errors.ForeignKeyViolation,
                                   'insert or update on table "archive_worker_runs" violates foreign key '
                                   'constraint "archive_worker_runs_retry_of_fkey"')
        row_id = self._next_id
        self._next_id += 1
        row: dict[str, Any] = dict.fromkeys(_RUN_FIELDS)
        row.update(id=row_id, run_id=self._run_id(row_id, now), queued_at=now, attempt=1)
        row.update(values)
        self.runs[row_id] = row
        self.by_run_id[row["run_id"]] = row
        self.by_text[str(row["run_id"])] = row
        self._slot[worker] = row
        if row["status"] == "RUNNING":
            self._running_by_runner.setdefault(row["runner_id"], {})[row["run_id"]] = row
        return row

    @staticmethod
    def _run_id(row_id: int, now: datetime) -> uuid.UUID:
        """A time-ordered UUIDv7 (as ``archive_uuid_v7()``): 48 bits of milliseconds, then the row's
        number where PostgreSQL puts random bits (deterministic, unique)."""
        millis = int(now.timestamp() * 1000) & ((1 << 48) - 1)
        low = row_id & ((1 << 74) - 1)
        value = (millis << 80) | (0x7 << 76) | ((low >> 62) << 64) | (0b10 << 62) | (low & ((1 << 62) - 1))
        return uuid.UUID(int=value)

    def _running(self, row: dict[str, Any]) -> None:
        self._running_by_runner.setdefault(row["runner_id"], {})[row["run_id"]] = row

    def _ended(self, row: dict[str, Any], previous_status: str) -> None:
        """The row left the slot (terminal now)."""
        if self._slot.get(row["worker_name"]) is row:
            del self._slot[row["worker_name"]]
        if previous_status == "RUNNING":
            held = self._running_by_runner.get(row["runner_id"])
            if held is not None:
                held.pop(row["run_id"], None)
                if not held:
                    del self._running_by_runner[row["runner_id"]]

    def _claimable(self, capabilities: Iterable[str], now: datetime) -> list[dict[str, Any]]:
        rows = [self._slot[w] for w in dict.fromkeys(capabilities) if w in self._slot]
        rows = [r for r in rows if r["status"] == "QUEUED" and (r["not_before"] is None or r["not_before"] <= now)]
        return sorted(rows, key=lambda r: (r["queued_at"], r["id"]))


def _known_release(locks: list[RowLock]) -> datetime | None:
    """When the last of ``locks`` goes by itself; None when one of them has no release time."""
    releases = [lock.release_at for lock in locks]
    return None if any(at is None for at in releases) else max(at for at in releases if at is not None)
