"""The scheduler process: exactly one is active, decided in the database by an advisory lock.

Every scheduler holds a dedicated connection and tries ``pg_try_advisory_lock`` on each tick; the one
that holds it is the leader and ticks, the others stand by. If the leader dies, its connection closes,
PostgreSQL releases the lock, and a standby takes over on its next tick.

The lock is a session's, so it needs a session of its own: behind a transaction pooler (PgBouncer in
transaction mode) the leader connection goes to ``DATABASE_SESSION_URL`` (``leader_engine``). Without
one, a pooler shows itself when the lock's session changes under the same connection (its backend pid
differs between ticks): the scheduler then says so, once, and stops leading rather than lead beside
another (decision 0122).
"""
from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Engine

from scrinalia.db.errors import database_errors, database_problem
from scrinalia.domains.archive import charts, ledger
from scrinalia.domains.archive.workers.validation import Catalogue
from scrinalia.scheduler.quarantine import DEFAULT_AFTER, Quarantine, quarantine_crash_loops
from scrinalia.scheduler.retry import Retry, retry_failed_scheduled_runs
from scrinalia.scheduler.schedules import TickOutcome, fire_due_schedules

log = logging.getLogger("scrinalia.scheduler")

#: The scheduler's sessions are bounded by the server (decision 0101): a tick is a few one-statement
#: steps of milliseconds, so no statement may run 10 s, no lock be waited on 5 s, no transaction idle
#: 10 s; a connection attempt gives up after 5 s. A tick that hits a bound fails with one log line and
#: the next tick tries again: the scheduler never waits without a bound.
SESSION_BOUNDS: dict[str, object] = {
    "connect_timeout": 5,
    "options": "-c statement_timeout=10000 -c lock_timeout=5000 -c idle_in_transaction_session_timeout=10000",
}

# A fixed 64-bit key: hashtext('scrinalia-scheduler') would do too, but a literal is greppable.
LEADER_LOCK_KEY = 0x5C41_5C4E_0001


@dataclass
class TickReport:
    leader: bool
    fired: list[TickOutcome] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    quarantined: list[Quarantine] = field(default_factory=list)
    expired: int = 0
    pruned_samples: int = 0


class Scheduler:
    def __init__(self, engine: Engine, catalogue: Catalogue | None = None, *,
                 quarantine_after: int = DEFAULT_AFTER,
                 samples_retention_days: int = charts.DEFAULT_SAMPLES_RETENTION_DAYS,
                 leader_engine: Engine | None = None) -> None:
        """``catalogue``: the workers a tick validates against (default: the installed plugins, the
        runners' own catalogue). ``quarantine_after``: chains in a row that ended FAILED the same way
        before a schedule is quarantined (``SCHEDULER_QUARANTINE_AFTER``; 0: never).
        ``samples_retention_days``: how long the runs' chart samples are kept (RUN_SAMPLES_RETENTION_DAYS);
        each tick deletes a bounded batch of older ones. ``leader_engine``: where the leader lock's session
        is opened (a direct connection past a pooler; default ``engine``)."""
        if catalogue is None:
            from scrinalia.domains.archive.workers.plugins import load_catalogue

            catalogue = load_catalogue()
        self.engine = engine
        self.leader_engine = leader_engine if leader_engine is not None else engine
        self.catalogue = catalogue
        self.quarantine_after = quarantine_after
        self.samples_retention_days = samples_retention_days
        self._leader_conn: psycopg.Connection | None = None
        self._leader_pid: int | None = None  # the backend that holds the lock
        self.pooled = False                  # the lock's session changed under us: a transaction pooler

    def _hold_leadership(self) -> bool:
        if self.pooled:
            return False
        if self._leader_conn is None:
            pooled = self.leader_engine.raw_connection()
            # Detached from the pool: closing it really ends the session, and with it the lock. A
            # pooled connection would carry the lock back into the pool.
            driver = pooled.driver_connection
            assert driver is not None, "a checked-out connection has a driver connection"
            pooled.detach()
            driver.autocommit = True
            self._leader_conn = driver
        try:
            with self._leader_conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (LEADER_LOCK_KEY,))
                answer = cur.fetchone()
                held = answer is not None and bool(answer[0])
        except Exception:
            self.release()
            raise
        if answer is not None and self._leader_pid not in (None, answer[1]):
            log.error("scheduler: the leader lock's session changed under its connection (backend %s, then %s): "
                      "a transaction pooler is in the way, and a session lock means nothing through it; not "
                      "leading. Set DATABASE_SESSION_URL to a direct connection (docs/install.md, "
                      "\"PgBouncer and managed PostgreSQL\")", self._leader_pid, answer[1])
            self.pooled = True
            self.release()
            return False
        if answer is not None and self._leader_pid is None:
            self._leader_pid = answer[1]  # this connection's session: it must stay the same one
        return held

    def release(self) -> None:
        if self._leader_conn is not None:
            try:
                # Unlock explicitly: the server drops a closed session's locks only once its backend
                # has exited, which a standby could otherwise race with.
                self._leader_conn.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error:
                pass  # the session is already gone, and its locks with it
            finally:
                self._leader_conn.close()
                self._leader_conn = None
                self._leader_pid = None

    def tick(self) -> TickReport:
        if not self._hold_leadership():
            return TickReport(leader=False)
        report = TickReport(leader=True)
        # Expiring leases here too lets retries of crashed scheduled runs proceed with no runner online.
        report.expired = len(ledger.expire_leases(self.engine))
        report.retries = retry_failed_scheduled_runs(self.engine)
        # After the retries (a chain that is still being retried has not ended) and before the firing
        # (a quarantined schedule fires no new chain).
        report.quarantined = quarantine_crash_loops(self.engine, self.quarantine_after)
        report.fired = fire_due_schedules(self.engine, self.catalogue)
        report.pruned_samples = charts.prune_samples(self.engine, self.samples_retention_days)
        for item in report.fired:
            log.info("schedule %s (%s): %s %s", item.schedule_id, item.worker_name, item.outcome, item.run_id or "")
        for q in report.quarantined:
            log.warning("schedule %s (%s) quarantined: %s; fingerprint %r, last run %s", q.schedule_id,
                        q.worker_name, q.reason, q.fingerprint, q.run_id)
        for retry in report.retries:
            log.info("retry of %s (%s): attempt %s as %s", retry.retry_of, retry.worker_name, retry.attempt,
                     retry.run_id)
        return report

    def serve(self, interval_s: float = 5.0, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        was_leader = None
        try:
            while not stop.is_set():
                try:
                    leader = self.tick().leader
                    if leader != was_leader:
                        log.info("scheduler is %s", "the leader" if leader else "standing by")
                        was_leader = leader
                except database_errors() as exc:  # the database is down or refuses us: one line, retry
                    log.warning("scheduler tick failed: %s; retrying in %.0f s", database_problem(exc), interval_s)
                except Exception:
                    log.exception("scheduler tick failed; retrying in %.0f s", interval_s)
                stop.wait(interval_s)
        finally:
            self.release()
