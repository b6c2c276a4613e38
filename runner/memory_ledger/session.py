"""``InMemoryLedger``: one session on a ``MemoryDatabase``, the ledger port statement for statement, each
method the twin of the named query of the same name (``@statement``)."""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import psycopg.errors

from runner.memory_ledger.batch import InMemoryBatch
from runner.memory_ledger.errors import integrity_error
from runner.memory_ledger.locks import UPDATE
from runner.memory_ledger.twins import statement
from runner.memory_ledger.values import duration_ms, error_fingerprint, jsonb, seconds
from scrinalia.db.engine import ServerFacts
from scrinalia.db.tables import ERROR_MAX
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import RunAlreadyFinished, RunNotFound
from scrinalia.domains.archive.ledger import FinishParams, HeartbeatResult, StartParams, WorkerRun
from scrinalia.domains.archive.registry import RunnerRegistration, RunnerRow

if TYPE_CHECKING:
    from runner.memory_ledger.database import MemoryDatabase

#: What a first connection learns of a PostgreSQL 16 server (``ServerFacts``): the in-memory ledger's answer.
MEMORY_SERVER_FACTS = ServerFacts(server_version_info=(16, 0), default_schema_name="public",
                                  default_isolation_level="READ COMMITTED", backslash_escapes=False)

_ACTIVE = ("QUEUED", "RUNNING")
_RUNNER_FIELDS = tuple(f.name for f in fields(RunnerRow) if f.name != "state")


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

    @statement("enqueue")
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
                "requested_by_user_id": requested_by_user_id, "request": jsonb(clean), "attempt": attempt,
                "retry_of": retry_of, "schedule_id": schedule_id,
                "not_before": None if not_before_delay_s is None else now + seconds(not_before_delay_s),
            }, now)
            return WorkerRun(**row)

    @statement("claim_next")
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
                    raise integrity_error("claim_next", psycopg.errors.ForeignKeyViolation,
                                           'insert or update on table "archive_worker_runs" violates foreign '
                                           'key constraint "archive_worker_runs_runner_id_fkey"')
                row.update(status="RUNNING", runner_id=runner_id, started_at=now, heartbeat_at=now,
                           lease_expires_at=now + seconds(lease_seconds))
                db._running(row)
                return WorkerRun(**row)
            return None

    @statement("create_running")
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
                "request": jsonb(clean), "runner_id": runner_id, "started_at": now, "heartbeat_at": now,
                "lease_expires_at": now + seconds(lease_seconds),
            }, now)
            return WorkerRun(**row)

    def _held_row(self, run_id: uuid.UUID, runner_id: uuid.UUID) -> dict[str, Any] | None:
        row = self.db.by_run_id.get(run_id)
        if row is None or row["runner_id"] != runner_id or row["status"] != "RUNNING":
            return None
        return row

    @statement("record_start")
    def record_start(self, run_id: uuid.UUID, runner_id: uuid.UUID, params: StartParams) -> bool:
        with self._statement("record_start"):
            now = self.db.now()
            row = self._held_row(run_id, runner_id)
            if row is None:
                return False
            if self._wait_for("record_start", [row], now) and self._held_row(run_id, runner_id) is None:
                return False
            row.update(engine_name=params.engine_name, preset=params.preset)
            if run_id not in self.db.configured:  # the configuration's own row, once (ON CONFLICT DO NOTHING)
                self.db.configured.add(run_id)
                row.update(config=jsonb(params.config), options=jsonb(params.options))
            return True

    @statement("heartbeat")
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
            until = now + seconds(lease_seconds)
            registry = self._renew_registry(runner_id, now, children, warm)
            held: dict[uuid.UUID, datetime | None] = {}
            for row in rows:
                row["heartbeat_at"], row["lease_expires_at"] = now, until
                held[row["run_id"]] = row["cancel_requested_at"]
            if progress:
                self._beat_progress(progress, held)
            return HeartbeatResult(
                registry_renewed=registry is not None, held=held,
                drain_requested_at=registry["drain_requested_at"] if registry is not None else None,
                db_now=now, lease_expires_at=until,
            )

    def _renew_registry(self, runner_id: uuid.UUID, now: datetime, children: Sequence[Mapping[str, Any]] | None,
                        warm: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The heartbeat's registry part: ``last_heartbeat_at``, and the children's snapshot and the warm
        models when sent."""
        registry = self.db.runners.get(runner_id)
        if registry is not None:
            registry["last_heartbeat_at"] = now
            if children is not None:
                registry["children"] = jsonb(children)
            if warm is not None:
                registry["warm"] = jsonb(warm)
        return registry

    def _beat_progress(self, progress: Mapping[Any, Mapping[str, Any]], held: Mapping[uuid.UUID, Any]) -> None:
        """``COALESCE(:progress -> r.run_id::text, r.progress)`` on the renewed rows: the key's text names
        the row."""
        for key, value in jsonb({str(k): v for k, v in progress.items()}).items():
            named = self.db.by_text.get(key)
            if named is not None and named["run_id"] in held:
                named["progress"] = value

    def _progress_changes(self, runner_id: uuid.UUID, progress: Mapping[str, Any]) -> list[tuple[dict[str, Any], Any]]:
        """The held rows whose progress differs from what is sent (``IS DISTINCT FROM``), with the new value."""
        changes = []
        for key, value in progress.items():
            found = self.db.by_text.get(key)
            row = self._held_row(found["run_id"], runner_id) if found is not None else None
            if row is not None and row["progress"] != value:
                changes.append((row, value))
        return changes

    @statement("record_progress")
    def record_progress(self, runner_id: uuid.UUID, progress: Mapping[Any, Mapping[str, Any]]) -> int:
        if not progress:
            return 0
        with self._statement("record_progress"):
            now = self.db.now()
            changes = self._progress_changes(runner_id, jsonb({str(k): v for k, v in progress.items()}))
            if self._wait_for("record_progress", [row for row, _ in changes], now):
                changes = [(row, value) for row, value in changes
                           if self._held_row(row["run_id"], runner_id) is not None and row["progress"] != value]
            for row, value in changes:
                row["progress"] = value
            return len(changes)

    @statement("finish")
    def finish(self, run_id: uuid.UUID, runner_id: uuid.UUID, params: FinishParams) -> WorkerRun | None:
        with self._statement("finish"):
            now = self.db.now()
            row = self._held_row(run_id, runner_id)
            if row is None:
                return None
            if self._wait_for("finish", [row], now) and self._held_row(run_id, runner_id) is None:
                return None
            error = None if params.error is None else params.error[:ERROR_MAX]
            row.update(status=params.status, finished_at=now, duration_ms=duration_ms(now, row["started_at"]),
                       error=error, error_fingerprint=error_fingerprint(error), exit_code=params.exit_code,
                       exit_signal=params.exit_signal, exit_reason=params.exit_reason)
            for key, value in (("progress", params.progress), ("metrics", params.metrics),
                               ("result", params.result)):
                if value is not None:
                    row[key] = jsonb(value)
            self.db._ended(row, "RUNNING")
            return WorkerRun(**row)

    @statement("expire_leases")
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
                row.update(status="INTERRUPTED", finished_at=now, duration_ms=duration_ms(now, row["started_at"]),
                           exit_reason="lease-lost", error=error, error_fingerprint=error_fingerprint(error))
                db._ended(row, "RUNNING")
            return [WorkerRun(**row) for row in expired]

    @statement("request_cancel")
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

    @statement("get_run")
    def get_run(self, run_id: uuid.UUID) -> WorkerRun | None:
        with self._statement("get_run"):
            row = self.db.by_run_id.get(run_id)
            return WorkerRun(**row) if row is not None else None

    @statement("active_run")
    def active_run(self, worker_name: str) -> WorkerRun | None:
        with self._statement("active_run"):
            row = self.db._slot.get(worker_name)
            return WorkerRun(**row) if row is not None else None

    @statement("worker_settings")
    def worker_settings(self, worker_name: str) -> dict[str, Any] | None:
        with self._statement("worker_settings"):
            row = self.db.settings.get(worker_name)
            return dict(row) if row is not None else None

    @statement("llm_check_rule")
    def llm_check_rule(self) -> dict[str, Any] | None:
        with self._statement("llm_check_rule"):
            rule = self.db.llm_check_rule
            return None if rule is None else {**rule, "engine_options": dict(rule["engine_options"])}

    def server_facts(self) -> ServerFacts | None:
        """What a PostgreSQL 16 server says to a first connection (the in-memory ledger has no other)."""
        return MEMORY_SERVER_FACTS

    # --- the registry -------------------------------------------------------------------------------

    @statement("register")
    def register(self, registration: RunnerRegistration) -> None:
        with self._statement("register"):
            db = self.db
            if not registration.lease_seconds > registration.heartbeat_seconds:  # CHECKs come before indexes
                raise integrity_error("register", psycopg.errors.CheckViolation,
                                       'new row for relation "archive_worker_runners" violates check constraint '
                                       '"ck_runner_lease_exceeds_heartbeat"')
            if registration.runner_id in db.runners:
                raise integrity_error("register", psycopg.errors.UniqueViolation,
                                       'duplicate key value violates unique constraint "archive_worker_runners_pkey"')
            now = db.now()
            row: dict[str, Any] = dict.fromkeys(_RUNNER_FIELDS)
            row.update({f.name: getattr(registration, f.name) for f in fields(RunnerRegistration)})
            row.update(capabilities=list(registration.capabilities), devices=jsonb(registration.devices),
                       sees=jsonb(registration.sees), children=[], warm={}, started_at=now,
                       last_heartbeat_at=now)
            db.runners[registration.runner_id] = row

    @statement("stop")
    def stop(self, runner_id: uuid.UUID) -> bool:
        with self._statement("stop"):
            row = self.db.runners.get(runner_id)
            if row is None or row["stopped_at"] is not None:
                return False
            row.update(stopped_at=self.db.now(), children=[])
            return True

    @statement("request_drain")
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
