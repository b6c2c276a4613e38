"""An in-memory ledger with PostgreSQL's semantics for the protocol: the deterministic simulator's database.

``MemoryDatabase`` is the shared world (the runs, the registry, the persisted settings, the row locks of
other sessions, the batches committed) on a clock it is GIVEN (a callable returning the database's now:
the simulator drives virtual time). ``InMemoryLedger`` is one session on it (a runner's, a child's, the
API's) and implements ``runner.ledger_port.LedgerPort`` statement for statement, as the SQL of
``scrinalia.domains.archive.ledger`` does (``tests/ledger/test_conformance.py`` runs the same tests on
both):

* the slot index ``uq_worker_run_active``: at most one QUEUED-or-RUNNING row per worker; a second one is
  ``WorkerRunAlreadyActive`` carrying the active run; the foreign keys (a claim by an unregistered runner,
  a retry of an unknown run) and the registry's CHECK fail as ``IntegrityError`` as they do there;
* the claim: the oldest (queued_at, id) QUEUED row among the capabilities whose ``not_before`` has come,
  ``SKIP LOCKED`` (a row another session holds locked is skipped); the expiry skips them too;
* the database clock: every timestamp is the clock's value when the statement starts (``now()``); the
  batch fence reads it again at COMMIT (``clock_timestamp()``);
* fenced statements (``runner_id = me AND status = 'RUNNING'``), the heartbeat's answer (what it holds,
  with the cancel requests; the drain request), cancellation both ways, leases and their expiry;
* the batch fence: refused at registration when the lease is gone, checked again at COMMIT (SQLSTATE
  ``ledger.BATCH_FENCE_SQLSTATE``, the SDK's ``LeaseLost``);
* row locks held by another (frozen) session, ``MemoryDatabase.lock_row``: a statement that must lock a
  row held in a conflicting mode waits for it up to its session's ``lock_timeout_s`` (the batch COMMIT:
  migration 0008's own 2 s) and then fails ``blocked`` (SQLSTATE 55P03), as PostgreSQL does. The wait is
  charged to the world's time through the database's ``elapse`` callback (the simulator advances its
  clock), and the error's ``orig.waited_seconds`` says how long it waited. A lock given a release time
  that comes within the bound is waited for and the statement proceeds.

Errors are the callers' usual ones (SQLAlchemy ``DBAPIError`` subclasses wrapping psycopg errors, named by
``classify_database_error``), so a caller cannot tell the adapters apart. ``unreachable_error`` and
friends build the same errors for the simulator's faults; a ``StatementFaults`` hook on a session is
consulted before and after each of its statements (a fault after the statement: it took effect, the
answer was lost).

Pure Python, deterministic (run ids from a counter and the clock, no randomness, no threads). Returned
JSON values are shared with the store: a caller must not mutate them (the supervisor never does).
"""
from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg
import psycopg.errors
from sqlalchemy.exc import DBAPIError

from scrinalia.db.tables import ERROR_MAX
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import RunAlreadyFinished, RunNotFound, WorkerRunAlreadyActive
from scrinalia.domains.archive.ledger import HeartbeatResult, WorkerRun
from scrinalia.domains.archive.registry import RunnerRegistration, RunnerRow

Clock = Callable[[], datetime]

#: Row-lock modes another session may hold (PostgreSQL's FOR SHARE / FOR UPDATE). Every UPDATE of the
#: protocol takes FOR NO KEY UPDATE, which conflicts with both; the batch COMMIT's FOR SHARE conflicts
#: with FOR UPDATE only; a ``SKIP LOCKED`` claim or expiry skips a row held in either mode.
SHARE, UPDATE = "share", "update"

_RUN_FIELDS = tuple(f.name for f in fields(WorkerRun))
_RUNNER_FIELDS = tuple(f.name for f in fields(RunnerRow) if f.name != "state")
_ACTIVE = ("QUEUED", "RUNNING")


# --- the errors PostgreSQL and psycopg raise, wrapped as SQLAlchemy wraps them ----------------------------


def _wrap(what: str, orig: psycopg.Error, *, invalidated: bool = False) -> DBAPIError:
    exc = DBAPIError.instance(f"-- in-memory ledger: {what}", None, orig, psycopg.Error,
                              connection_invalidated=invalidated)
    assert isinstance(exc, DBAPIError)  # always, for a psycopg.Error
    return exc


def blocked_error(what: str, waited_seconds: float) -> DBAPIError:
    """``lock_timeout`` ended a lock wait (SQLSTATE 55P03): ``blocked``. ``orig.waited_seconds``: the bound."""
    orig = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    orig.waited_seconds = waited_seconds  # type: ignore[attr-defined]
    return _wrap(what, orig)


def statement_timeout_error(what: str, waited_seconds: float) -> DBAPIError:
    """``statement_timeout`` ended a statement (SQLSTATE 57014): ``blocked``."""
    orig = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    orig.waited_seconds = waited_seconds  # type: ignore[attr-defined]
    return _wrap(what, orig)


def unreachable_error(what: str, message: str = "connection refused") -> DBAPIError:
    """No answer: a refused or broken connection, a socket shut by the client's guard (no SQLSTATE):
    ``unreachable``."""
    return _wrap(what, psycopg.OperationalError(message), invalidated=True)


def shutdown_error(what: str) -> DBAPIError:
    """The server is shutting down (a restart, a failover; SQLSTATE 57P01): ``unreachable``."""
    orig = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    return _wrap(what, orig, invalidated=True)


def _integrity_error(what: str, kind: type[psycopg.Error], message: str) -> DBAPIError:
    return _wrap(what, kind(message))


def _fence_refusal(what: str, message: str) -> DBAPIError:
    orig = psycopg.DatabaseError(message)
    orig.sqlstate = ledger.BATCH_FENCE_SQLSTATE  # a class PostgreSQL does not use: psycopg's DatabaseError
    return _wrap(what, orig)


# --- the generated column: archive_error_fingerprint (migration 0001), the same regular expressions ------

_WS = re.compile(r"\s+")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PATH = re.compile(r"(^|[\s'\"(=:,\[])(~?/[^\s'\"(),:\]]+)")
_HASH = re.compile(r"[0-9a-f]{16,}")
_DIGITS = re.compile(r"[0-9]+")


def error_fingerprint(error: str | None) -> str | None:
    if error is None:
        return None
    text = _WS.sub(" ", error.split("\n", 1)[0]).strip(" ").lower()
    text = _PATH.sub(r"\1<path>", _UUID.sub("<uuid>", text))
    return _DIGITS.sub("<n>", _HASH.sub("<hash>", text))[:200]


_SCALARS = frozenset({str, int, float, bool, type(None)})


class _NotPlain(Exception):
    pass


def _copy_plain(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            out[key] = _copy_plain(item)
        return out
    if kind is list:
        return [_copy_plain(item) for item in value]
    raise _NotPlain


def _jsonb(value: Any) -> Any:
    """What a value becomes through ``CAST(:x AS jsonb)`` of the ledger's ``_json`` and back. Plain JSON
    (dicts with str keys, lists, scalars: the usual case) is only copied; anything else (tuples, uuids,
    datetimes, non-str keys) goes through ``json`` as the ledger's ``_json`` sends it."""
    if value is None:
        return None
    try:
        return _copy_plain(value)
    except _NotPlain:
        return json.loads(json.dumps(value, default=str))


def _duration_ms(now: datetime, started_at: datetime | None) -> int | None:
    """``GREATEST(0, extract(epoch FROM now - started_at) * 1000)::bigint`` (the cast rounds half up)."""
    if started_at is None:
        return None
    micros = (now - started_at) // timedelta(microseconds=1)
    return max(0, (micros + 500) // 1000) if micros > 0 else 0


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=float(value))


# --- the world ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class RowLock:
    """A row lock held by another session (one frozen mid-transaction, say) until ``release`` or, when
    given, its ``release_at`` (the database clock): then it is gone by itself."""

    database: MemoryDatabase
    run_id: uuid.UUID
    mode: str
    release_at: datetime | None = None
    owner: InMemoryBatch | None = None  # the transaction that holds it (None: a session of the world's)

    def release(self) -> None:
        held = self.database.locks.get(self.run_id)
        if held is not None and self in held:
            held.remove(self)
            if not held:
                del self.database.locks[self.run_id]

    def conflicts(self, wanted: str) -> bool:
        return self.mode == UPDATE or wanted != SHARE


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """A batch whose COMMIT the fence let through: the simulator's "no batch after its lease" evidence."""

    run_id: uuid.UUID
    runner_id: uuid.UUID
    committed_at: datetime
    lease_expires_at: datetime
    payload: Any = None


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
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
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
        release_at = None if release_after_s is None else self.now() + _seconds(release_after_s)
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
        until = started + _seconds(bound)
        slice_ = _seconds(bound / 4)
        while True:
            conflicting = self._locked(run_id, wanted, now, owner)
            if not conflicting:
                return now
            if now >= until:
                raise blocked_error(what, (now - started).total_seconds())
            releases = [lock.release_at for lock in conflicting]
            known = None if any(at is None for at in releases) else max(at for at in releases if at is not None)
            wake = min(until, now + slice_, known) if known is not None else min(until, now + slice_)
            self._charge((wake - now).total_seconds())
            after = self.now()
            if after <= now:  # the clock does not move: decide at once
                if known is not None and known <= until:
                    for lock in conflicting:
                        lock.release()
                    return now
                raise blocked_error(what, bound)
            now = after

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
            "options": _jsonb(dict(values.get("options") or {})),
            "engine_options": _jsonb(dict(values.get("engine_options") or {})),
            "revision": (current["revision"] if current else 0) + 1,
            "updated_at": self.now().isoformat(),
            "updated_by": changed_by,
        }

    def runner(self, runner_id: uuid.UUID) -> RunnerRow | None:
        """The registry row, with its state by the database clock (``registry.get_runner``)."""
        row = self.runners.get(runner_id)
        if row is None:
            return None
        now = self.now()
        if row["stopped_at"] is not None:
            state = "stopped"
        elif row["last_heartbeat_at"] + _seconds(row["lease_seconds"]) >= now:
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
            raise _integrity_error(what, psycopg.errors.ForeignKeyViolation,
                                   'insert or update on table "archive_worker_runs" violates foreign key '
                                   'constraint "archive_worker_runs_runner_id_fkey"')
        if values.get("retry_of") is not None and values["retry_of"] not in self.by_run_id:
            raise _integrity_error(what, psycopg.errors.ForeignKeyViolation,
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


class _Unfaulted:
    """A statement with no faults hook: nothing before, nothing after (the simulator's hot path)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_UNFAULTED = _Unfaulted()


class _Faulted:
    def __init__(self, session: InMemoryLedger, faults: StatementFaults, what: str) -> None:
        self.session, self.faults, self.what = session, faults, what

    def __enter__(self) -> None:
        self.faults.before(self.session, self.what)

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.faults.after(self.session, self.what)


class StatementFaults(Protocol):
    """The simulator's hook on one session: ``before`` may raise (the statement never reached the server:
    a refused connection, a partition; or it may charge time: a slow statement), ``after`` may raise once
    the statement took effect (the answer was lost on the way back)."""

    def before(self, session: InMemoryLedger, what: str) -> None: ...

    def after(self, session: InMemoryLedger, what: str) -> None: ...


# --- one session: the port ---------------------------------------------------------------------------------


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
        return None if idle is None else self._last_active + _seconds(idle)

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
            raise _fence_refusal("commit", f"LeaseLost: run {self.run_id} is not held by runner "
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
            raise _wrap(what, psycopg.errors.IdleInTransactionSessionTimeout(
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


class InMemoryLedger:
    """``LedgerPort`` on a ``MemoryDatabase``: one session, with its own ``lock_timeout_s``."""

    def __init__(self, database: MemoryDatabase, *, lock_timeout_s: float, name: str = "session",
                 faults: StatementFaults | None = None, idle_in_transaction_s: float | None = None) -> None:
        if lock_timeout_s <= 0:
            raise ValueError("every session of the protocol has a lock_timeout (a wait without a bound hangs)")
        self.db = database
        self.lock_timeout_s = float(lock_timeout_s)
        self.idle_in_transaction_s = idle_in_transaction_s
        self.name = name
        self.faults = faults
        self.deadline: float | None = None  # the caller's bound (``bounded``), for the faults to honour
        self.batches: list[InMemoryBatch] = []  # this session's open transactions

    def close(self) -> None:
        """The session's connections close (its process died): its open transactions roll back, their
        row locks go with them."""
        for batch in list(self.batches):
            batch.rollback()

    def _statement(self, what: str) -> AbstractContextManager[None]:
        """One statement of this session: counted, and passed by the faults hook (before; after, unless
        it failed)."""
        self.db.statements += 1
        if self.faults is None:
            return _UNFAULTED
        return _Faulted(self, self.faults, what)

    @contextmanager
    def bounded(self, deadline: float | None) -> Iterator[None]:
        previous, self.deadline = self.deadline, deadline
        try:
            yield
        finally:
            self.deadline = previous

    def _wait_for(self, what: str, rows: Iterable[dict[str, Any]], now: datetime) -> bool:
        """Lock ``rows`` as an UPDATE does (waiting on other sessions, each within ``lock_timeout_s``).
        True when the clock moved meanwhile: then, as PostgreSQL re-checks a row it waited for against the
        statement's WHERE, the caller looks at the rows again (another actor may have changed them)."""
        if not self.db.locks:
            return False  # no other session holds anything (the usual case)
        after = now
        for row in rows:
            after = self.db._acquire(what, row, UPDATE, self.lock_timeout_s, after)
        return after != now

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
        clean = ledger.check_enqueue(worker_name, request, trigger=trigger, attempt=attempt)
        with self._statement("enqueue"):
            now = self.db.now()
            row = self.db._insert("enqueue", {
                "worker_name": worker_name, "status": "QUEUED", "trigger": trigger, "requested_by": requested_by,
                "requested_by_user_id": requested_by_user_id, "request": _jsonb(clean), "attempt": attempt,
                "retry_of": retry_of, "schedule_id": schedule_id,
                "not_before": None if not_before_delay_s is None else now + _seconds(not_before_delay_s),
            }, now)
            return WorkerRun(**row)

    def claim_next(self, runner_id: uuid.UUID, capabilities: Iterable[str], lease_seconds: float) -> WorkerRun | None:
        caps = list(capabilities)
        if not caps:
            return None
        with self._statement("claim_next"):
            db = self.db
            now = db.now()
            for row in db._claimable(caps, now):
                if db._locked(row["run_id"], UPDATE, now):
                    continue  # FOR UPDATE SKIP LOCKED
                if runner_id not in db.runners:
                    raise _integrity_error("claim_next", psycopg.errors.ForeignKeyViolation,
                                           'insert or update on table "archive_worker_runs" violates foreign '
                                           'key constraint "archive_worker_runs_runner_id_fkey"')
                row.update(status="RUNNING", runner_id=runner_id, started_at=now, heartbeat_at=now,
                           lease_expires_at=now + _seconds(lease_seconds))
                db._running(row)
                return WorkerRun(**row)
            return None

    def create_running(
        self,
        worker_name: str,
        request: Mapping[str, Any],
        *,
        runner_id: uuid.UUID,
        lease_seconds: float,
        requested_by: str | None = None,
    ) -> WorkerRun:
        ledger.validate_worker_name(worker_name)
        clean = ledger.validate_request(request)
        with self._statement("create_running"):
            now = self.db.now()
            row = self.db._insert("create_running", {
                "worker_name": worker_name, "status": "RUNNING", "trigger": "CLI", "requested_by": requested_by,
                "request": _jsonb(clean), "runner_id": runner_id, "started_at": now, "heartbeat_at": now,
                "lease_expires_at": now + _seconds(lease_seconds),
            }, now)
            return WorkerRun(**row)

    def _held_row(self, run_id: uuid.UUID, runner_id: uuid.UUID) -> dict[str, Any] | None:
        row = self.db.by_run_id.get(run_id)
        if row is None or row["runner_id"] != runner_id or row["status"] != "RUNNING":
            return None
        return row

    def record_start(
        self,
        run_id: uuid.UUID,
        runner_id: uuid.UUID,
        *,
        engine_name: str | None,
        preset: str | None,
        config: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
    ) -> bool:
        with self._statement("record_start"):
            now = self.db.now()
            row = self._held_row(run_id, runner_id)
            if row is None:
                return False
            if self._wait_for("record_start", [row], now) and self._held_row(run_id, runner_id) is None:
                return False
            row.update(engine_name=engine_name, preset=preset, config=_jsonb(config), options=_jsonb(options))
            return True

    def heartbeat(
        self,
        runner_id: uuid.UUID,
        lease_seconds: float,
        *,
        progress: Mapping[Any, Mapping[str, Any]] | None = None,
        children: Sequence[Mapping[str, Any]] | None = None,
        warm: Mapping[str, Any] | None = None,
    ) -> HeartbeatResult:
        with self._statement("heartbeat"):
            db = self.db
            now = db.now()
            rows = list(db._running_by_runner.get(runner_id, {}).values())
            if self._wait_for("heartbeat", rows, now):
                rows = [r for r in rows if r["status"] == "RUNNING" and r["runner_id"] == runner_id]
            until = now + _seconds(lease_seconds)
            registry = db.runners.get(runner_id)
            if registry is not None:
                registry["last_heartbeat_at"] = now
                if children is not None:
                    registry["children"] = _jsonb(children)
                if warm is not None:
                    registry["warm"] = _jsonb(warm)
            held: dict[uuid.UUID, datetime | None] = {}
            for row in rows:
                row["heartbeat_at"], row["lease_expires_at"] = now, until
                held[row["run_id"]] = row["cancel_requested_at"]
            if progress:  # COALESCE(:progress -> r.run_id::text, r.progress): the key's text names the row
                for key, value in _jsonb({str(k): v for k, v in progress.items()}).items():
                    named = db.by_text.get(key)
                    if named is not None and named["run_id"] in held:
                        named["progress"] = value
            return HeartbeatResult(
                registry_renewed=registry is not None, held=held,
                drain_requested_at=registry["drain_requested_at"] if registry is not None else None,
                db_now=now, lease_expires_at=until,
            )

    def record_progress(self, runner_id: uuid.UUID, progress: Mapping[Any, Mapping[str, Any]]) -> int:
        if not progress:
            return 0
        with self._statement("record_progress"):
            now = self.db.now()
            changes = []
            for key, value in _jsonb({str(k): v for k, v in progress.items()}).items():
                found = self.db.by_text.get(key)
                row = self._held_row(found["run_id"], runner_id) if found is not None else None
                if row is not None and row["progress"] != value:
                    changes.append((row, value))
            if self._wait_for("record_progress", [row for row, _ in changes], now):
                changes = [(row, value) for row, value in changes
                           if self._held_row(row["run_id"], runner_id) is not None and row["progress"] != value]
            for row, value in changes:
                row["progress"] = value
            return len(changes)

    def finish(
        self,
        run_id: uuid.UUID,
        runner_id: uuid.UUID,
        status: str,
        *,
        error: str | None = None,
        exit_code: int | None = None,
        exit_signal: int | None = None,
        exit_reason: str | None = None,
        progress: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> WorkerRun | None:
        ledger.check_finish(status, exit_reason)
        with self._statement("finish"):
            now = self.db.now()
            row = self._held_row(run_id, runner_id)
            if row is None:
                return None
            if self._wait_for("finish", [row], now) and self._held_row(run_id, runner_id) is None:
                return None
            error = None if error is None else error[:ERROR_MAX]
            row.update(status=status, finished_at=now, duration_ms=_duration_ms(now, row["started_at"]),
                       error=error, error_fingerprint=error_fingerprint(error), exit_code=exit_code,
                       exit_signal=exit_signal, exit_reason=exit_reason)
            for key, value in (("progress", progress), ("metrics", metrics), ("result", result)):
                if value is not None:
                    row[key] = _jsonb(value)
            self.db._ended(row, "RUNNING")
            return WorkerRun(**row)

    def expire_leases(self) -> list[WorkerRun]:
        with self._statement("expire_leases"):
            db = self.db
            now = db.now()
            expired = []
            for held in list(db._running_by_runner.values()):
                for row in list(held.values()):
                    if row["lease_expires_at"] < now and not db._locked(row["run_id"], UPDATE, now):
                        expired.append(row)
            expired.sort(key=lambda r: r["id"])
            for row in expired:
                error = ("LeaseExpired: the runner stopped renewing its lease (last heartbeat "
                         f"{row['heartbeat_at'].astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')})")
                row.update(status="INTERRUPTED", finished_at=now, duration_ms=_duration_ms(now, row["started_at"]),
                           exit_reason="lease-lost", error=error, error_fingerprint=error_fingerprint(error))
                db._ended(row, "RUNNING")
            return [WorkerRun(**row) for row in expired]

    def request_cancel(self, run_id: uuid.UUID, requested_by: str | None = None) -> WorkerRun:
        with self._statement("request_cancel"):
            now = self.db.now()
            row = self.db.by_run_id.get(run_id)
            if row is None:
                raise RunNotFound(run_id)
            if row["status"] not in _ACTIVE:
                raise RunAlreadyFinished(WorkerRun(**row))
            if self._wait_for("request_cancel", [row], now) and row["status"] not in _ACTIVE:
                raise RunAlreadyFinished(WorkerRun(**row))
            if row["cancel_requested_at"] is None:
                row["cancel_requested_at"] = now
            if row["cancel_requested_by"] is None:
                row["cancel_requested_by"] = requested_by
            if row["status"] == "QUEUED":
                row.update(status="CANCELLED", finished_at=now, duration_ms=0, exit_reason="cancelled")
                self.db._ended(row, "QUEUED")
            return WorkerRun(**row)

    # --- reads ------------------------------------------------------------------------------------------

    def get_run(self, run_id: uuid.UUID) -> WorkerRun | None:
        with self._statement("get_run"):
            row = self.db.by_run_id.get(run_id)
            return WorkerRun(**row) if row is not None else None

    def active_run(self, worker_name: str) -> WorkerRun | None:
        with self._statement("active_run"):
            row = self.db._slot.get(worker_name)
            return WorkerRun(**row) if row is not None else None

    def worker_settings(self, worker_name: str) -> dict[str, Any] | None:
        with self._statement("settings"):
            row = self.db.settings.get(worker_name)
            return dict(row) if row is not None else None

    # --- the registry -------------------------------------------------------------------------------

    def register(self, registration: RunnerRegistration) -> None:
        with self._statement("register"):
            db = self.db
            if not registration.lease_seconds > registration.heartbeat_seconds:  # CHECKs come before indexes
                raise _integrity_error("register", psycopg.errors.CheckViolation,
                                       'new row for relation "archive_worker_runners" violates check constraint '
                                       '"ck_runner_lease_exceeds_heartbeat"')
            if registration.runner_id in db.runners:
                raise _integrity_error("register", psycopg.errors.UniqueViolation,
                                       'duplicate key value violates unique constraint "archive_worker_runners_pkey"')
            now = db.now()
            row: dict[str, Any] = dict.fromkeys(_RUNNER_FIELDS)
            row.update({f.name: getattr(registration, f.name) for f in fields(RunnerRegistration)})
            row.update(capabilities=list(registration.capabilities), devices=_jsonb(registration.devices),
                       sees=_jsonb(registration.sees), children=[], warm={}, started_at=now, last_heartbeat_at=now)
            db.runners[registration.runner_id] = row

    def stop(self, runner_id: uuid.UUID) -> bool:
        with self._statement("stop"):
            row = self.db.runners.get(runner_id)
            if row is None or row["stopped_at"] is not None:
                return False
            row.update(stopped_at=self.db.now(), children=[])
            return True

    def request_drain(self, runner_id: uuid.UUID, requested_by: str | None = None) -> bool:
        with self._statement("request_drain"):
            row = self.db.runners.get(runner_id)
            if row is None or row["stopped_at"] is not None:
                return False
            if row["drain_requested_at"] is None:
                row["drain_requested_at"] = self.db.now()
            if row["drain_requested_by"] is None:
                row["drain_requested_by"] = requested_by
            return True

    # --- a child's batch ------------------------------------------------------------------------------

    def begin_batch(self, run_id: uuid.UUID, runner_id: uuid.UUID) -> InMemoryBatch:
        return InMemoryBatch(self, run_id, runner_id)
