"""Client-side bounds on the supervisor's database steps: nothing the loop sends may outlive its fence.

The server-side timeouts (``statement_timeout``, ``lock_timeout``) only help while the server answers,
and ``tcp_user_timeout`` only while the peer does not acknowledge: behind a VPN, a proxy or a NAT that
accepts bytes and never answers, or with packets dropped on the way back, a psycopg call blocks for as
long as the socket lives. Two guards make every step of the loop return in time, whatever the network
does (decision 0110):

* ``StatementGuard``: a pooled connection is *armed* when the loop checks it out, with a deadline (the
  statement bound, clipped to the self-fence point by ``deadline``), and disarmed when it is checked
  in. A small thread watches the armed connections; one still checked out at its deadline has its
  socket shut down (``shutdown(SHUT_RDWR)`` on a duplicate of libpq's descriptor). The blocked call
  then returns at once with a broken connection (``OperationalError``), SQLAlchemy invalidates it, and
  the loop goes on to its fence check. The thread never sends a byte: it writes nothing to the ledger,
  it only abandons a step that the loop would otherwise wait on.
* ``bounded_connect``: a new connection (DNS lookup, TCP connect, TLS handshake, authentication) is made
  on a helper thread and waited for at most the connect bound, clipped the same way. One that takes
  longer is abandoned (the thread closes it when it finally arrives) and the step fails as a connection
  error. libpq's own ``connect_timeout`` (whole seconds, at least 2) ends the helper thread eventually.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event

log = logging.getLogger("scrinalia.runner.bounded")

_GUARDS: weakref.WeakKeyDictionary[Engine, StatementGuard] = weakref.WeakKeyDictionary()


class StatementGuard:
    """Shuts the socket of a checked-out connection that outlives its deadline (see the module doc)."""

    def __init__(self, bound_seconds: float, connect_seconds: float) -> None:
        self.bound_seconds = bound_seconds
        self.connect_seconds = connect_seconds
        self.abandoned = 0  # steps abandoned at their deadline (the status shows them)
        self._limit = threading.local()  # the caller's clip (the fence point), CLOCK_MONOTONIC
        self._armed: dict[int, tuple[float, int]] = {}  # id(connection record) -> (deadline, dup'ed fd)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- the caller's side ---------------------------------------------------------------------

    def deadline(self) -> float:
        """When a step that starts now must be over: the bound, clipped to the caller's limit."""
        now = time.monotonic()
        limit = getattr(self._limit, "at", None)
        at = now + self.bound_seconds
        return at if limit is None else min(at, limit)

    def connect_deadline(self) -> float:
        now = time.monotonic()
        limit = getattr(self._limit, "at", None)
        at = now + self.connect_seconds
        return at if limit is None else min(at, limit)

    @contextmanager
    def limited(self, at: float | None) -> Iterator[None]:
        """Steps made inside (on this thread) end by ``at`` at the latest (None: the bound alone)."""
        previous = getattr(self._limit, "at", None)
        self._limit.at = at if previous is None or at is None else min(at, previous)
        try:
            yield
        finally:
            self._limit.at = previous

    # --- the pool's side -----------------------------------------------------------------------

    def arm(self, record: Any, dbapi_connection: Any) -> None:
        try:
            fd = os.dup(dbapi_connection.pgconn.socket)
        except Exception:  # a closed connection: its next use fails by itself
            return
        at = self.deadline()
        with self._cond:
            old = self._armed.pop(id(record), None)
            if old is not None:
                os.close(old[1])
            self._armed[id(record)] = (at, fd)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="statement-guard", daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self, record: Any) -> None:
        with self._cond:
            armed = self._armed.pop(id(record), None)
        if armed is not None:
            os.close(armed[1])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for _, fd in self._armed.values():
                os.close(fd)
            self._armed.clear()
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                due = [key for key, (at, _) in self._armed.items() if at <= now]
                for key in due:
                    _, fd = self._armed.pop(key)
                    self._abandon(fd)
                pending = [at for at, _ in self._armed.values()]
                self._cond.wait(None if not pending else max(0.0, min(pending) - now))

    def _abandon(self, fd: int) -> None:
        self.abandoned += 1
        try:
            sock = socket.socket(fileno=fd)  # owns the duplicate: closing it leaves libpq's descriptor
        except OSError:
            os.close(fd)
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()
        log.warning("database: a step ran past its bound; its connection was abandoned")


def bounded_connect(dialect: Any, cargs: tuple[Any, ...], cparams: dict[str, Any], deadline: float) -> Any:
    """``dialect.connect(*cargs, **cparams)`` on a helper thread, waited for until ``deadline``."""
    done = threading.Event()
    box: dict[str, Any] = {}
    abandoned = threading.Event()

    def attempt() -> None:
        try:
            conn = dialect.connect(*cargs, **cparams)
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        else:
            box["conn"] = conn
            if abandoned.is_set():
                _close_quietly(conn)
        finally:
            done.set()

    threading.Thread(target=attempt, name="bounded-connect", daemon=True).start()
    done.wait(max(0.0, deadline - time.monotonic()))
    if not done.is_set():
        abandoned.set()
        if done.is_set() and "conn" in box:  # arrived between the wait and the flag
            _close_quietly(box["conn"])
        raise dialect.loaded_dbapi.OperationalError(
            "connection attempt abandoned: no connection within its bound (DNS, TCP, TLS or authentication)"
        )
    if "error" in box:
        raise box["error"]
    return box["conn"]


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


def install(engine: Engine, bound_seconds: float, connect_seconds: float) -> StatementGuard:
    """Bound every step of ``engine`` (checkout to checkin) and every new connection of its pool."""
    guard = StatementGuard(bound_seconds, connect_seconds)

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, conn_rec: Any, cargs: tuple[Any, ...], cparams: dict[str, Any]) -> Any:
        return bounded_connect(dialect, cargs, cparams, guard.connect_deadline())

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        guard.arm(record, dbapi_connection)

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, record: Any) -> None:
        guard.disarm(record)

    _GUARDS[engine] = guard
    return guard


def guard_of(engine: Engine) -> StatementGuard | None:
    return _GUARDS.get(engine)


@contextmanager
def until(engine: Engine, at: float | None) -> Iterator[None]:
    """Steps of ``engine`` on this thread end by ``at`` (the self-fence point); no-op without a guard."""
    guard = _GUARDS.get(engine)
    if guard is None:
        yield
        return
    with guard.limited(at):
        yield
