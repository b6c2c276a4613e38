"""``classify_database_error`` in one word per kind of failure (decision 0103), pinned for every branch
with the drivers' own exception types (tests/runner/test_database_state.py makes the real ones happen)."""
from __future__ import annotations

import psycopg
import psycopg.errors as pg
import pytest
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from scrinalia.db.errors import classify_database_error


def _wrapped(orig: BaseException, invalidated: bool = False) -> DBAPIError:
    return DBAPIError("SELECT 1", {}, orig, connection_invalidated=invalidated)


class _NoState(Exception):
    sqlstate = None


@pytest.mark.parametrize(("exc", "state"), [
    (pg.LockNotAvailable(), "blocked"),
    (_wrapped(pg.QueryCanceled()), "blocked"),
    (_wrapped(pg.IdleInTransactionSessionTimeout()), "blocked"),
    (_wrapped(pg.AdminShutdown()), "unreachable"),
    (pg.CannotConnectNow(), "unreachable"),
    (pg.TooManyConnections(), "unreachable"),
    (_wrapped(pg.ConnectionFailure()), "unreachable"),       # class 08
    (pg.ProtocolViolation(), "unreachable"),                  # 08P01
    (_wrapped(psycopg.OperationalError("refused")), "unreachable"),  # libpq: no server answer
    (PoolTimeout("pool"), "unreachable"),
    (_wrapped(_NoState("gone"), invalidated=True), "unreachable"),
    (_wrapped(_NoState("other")), "error"),
    (_wrapped(pg.UndefinedTable()), "error"),
    (_wrapped(pg.UndefinedTable(), invalidated=True), "error"),  # the server answered: not unreachable
    (ValueError("not a database error"), "error"),
])
def test_each_failure_is_named_by_its_state(exc, state):
    assert classify_database_error(exc) == state
