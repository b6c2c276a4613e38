"""The errors PostgreSQL and psycopg raise, wrapped as SQLAlchemy wraps them: the in-memory ledger's, and the
simulator's faults' (``classify_database_error`` names them as it names the real ones)."""
from __future__ import annotations

import psycopg
import psycopg.errors
from sqlalchemy.exc import DBAPIError

from scrinalia.domains.archive import ledger


def wrap_error(what: str, orig: psycopg.Error, *, invalidated: bool = False) -> DBAPIError:
    exc = DBAPIError.instance(f"-- in-memory ledger: {what}", None, orig, psycopg.Error,
                              connection_invalidated=invalidated)
    assert isinstance(exc, DBAPIError)  # always, for a psycopg.Error
    return exc


def blocked_error(what: str, waited_seconds: float) -> DBAPIError:
    """``lock_timeout`` ended a lock wait (SQLSTATE 55P03): ``blocked``. ``orig.waited_seconds``: the bound."""
    orig = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    orig.waited_seconds = waited_seconds  # type: ignore[attr-defined]
    return wrap_error(what, orig)


def statement_timeout_error(what: str, waited_seconds: float) -> DBAPIError:
    """``statement_timeout`` ended a statement (SQLSTATE 57014): ``blocked``."""
    orig = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    orig.waited_seconds = waited_seconds  # type: ignore[attr-defined]
    return wrap_error(what, orig)


def unreachable_error(what: str, message: str = "connection refused") -> DBAPIError:
    """No answer: a refused or broken connection, a socket shut by the client's guard (no SQLSTATE):
    ``unreachable``."""
    return wrap_error(what, psycopg.OperationalError(message), invalidated=True)


def shutdown_error(what: str) -> DBAPIError:
    """The server is shutting down (a restart, a failover; SQLSTATE 57P01): ``unreachable``."""
    orig = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    return wrap_error(what, orig, invalidated=True)


def integrity_error(what: str, kind: type[psycopg.Error], message: str) -> DBAPIError:
    return wrap_error(what, kind(message))


def fence_refusal(what: str, message: str) -> DBAPIError:
    orig = psycopg.DatabaseError(message)
    orig.sqlstate = ledger.BATCH_FENCE_SQLSTATE  # a class PostgreSQL does not use: psycopg's DatabaseError
    return wrap_error(what, orig)
