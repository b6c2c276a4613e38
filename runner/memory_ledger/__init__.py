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

By concept, one module each: ``database`` (the shared rows and indexes, the world's own writes, row locks
and their waits), ``session`` (``InMemoryLedger``: the port's statements), ``batch`` (a child's batch and
its fence), ``locks``, ``errors``, ``values`` (fingerprint, jsonb, ``duration_ms``) and ``twins`` (each
method marked ``@statement("<name>")``, the twin of that named query of ``queries.sql``).

Pure Python, deterministic (run ids from a counter and the clock, no randomness, no threads). Returned
JSON values are shared with the store: a caller must not mutate them (the supervisor never does).
"""
from runner.memory_ledger.batch import CommittedBatch, InMemoryBatch
from runner.memory_ledger.database import Clock, MemoryDatabase
from runner.memory_ledger.errors import blocked_error, shutdown_error, statement_timeout_error, unreachable_error
from runner.memory_ledger.locks import SHARE, UPDATE, RowLock
from runner.memory_ledger.session import MEMORY_SERVER_FACTS, InMemoryLedger, StatementFaults
from runner.memory_ledger.twins import TWINS, statement
from runner.memory_ledger.values import error_fingerprint

__all__ = [
    "MEMORY_SERVER_FACTS", "SHARE", "TWINS", "UPDATE", "Clock", "CommittedBatch", "InMemoryBatch", "InMemoryLedger",
    "MemoryDatabase", "RowLock", "StatementFaults", "blocked_error", "error_fingerprint", "shutdown_error",
    "statement", "statement_timeout_error", "unreachable_error",
]
