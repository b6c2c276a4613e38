"""A database error as one line for an operator, and the exit code every CLI gives it.

A CLI that cannot reach or use the database prints ``database error: <what PostgreSQL or libpq
said>`` and exits ``EXIT_DATABASE`` (5, the runner's "the database does not answer"), never a
traceback (docs/operations.md, "Exit codes"). The line carries libpq's reasons (every address tried,
a TLS refusal, an authentication failure) but never a password: statements' parameters are hidden by
the engine (``hide_parameters``) and anything shaped like a password in a URL or a conninfo is masked.
"""
from __future__ import annotations

import re

#: The exit code of every command on a database error (the runner's EXIT_DATABASE is the same).
EXIT_DATABASE = 5

_MAX = 600
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_CONNINFO_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def database_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the database refused or did not answer"."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    return (DBAPIError, psycopg.Error)


def describe_database_error(exc: BaseException) -> str:
    """libpq's or PostgreSQL's message on one line, without SQLAlchemy's statement echo or a secret."""
    orig = getattr(exc, "orig", None) or exc
    lines = [" ".join(line.split()) for line in str(orig).splitlines()]
    text = "; ".join(line for line in lines if line and not line.startswith("(Background on this error"))
    text = _CONNINFO_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
    return f"{type(orig).__name__}: {text[:_MAX]}"


# --- blocked or unreachable (decision 0103) ------------------------------------------------------

#: The server answered, but a bound we set stopped the statement: a lock it waited on (lock_timeout),
#: a statement that ran too long (statement_timeout, or a cancel), a transaction left idle too long.
BLOCKED_SQLSTATES = frozenset({"55P03", "57014", "25P03"})
#: The server is going away or not accepting connections yet (a restart, a failover, a crash).
UNREACHABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})

DatabaseState = str  # "ok" | "blocked" | "unreachable" | "error"


def classify_database_error(exc: BaseException) -> DatabaseState:
    """What an operator should be told about a failed statement, in one word:

    * ``blocked``: the server answers, but a lock or a statement outlived its bound (SQLSTATE 55P03
      lock_not_available, 57014 query_canceled, 25P03 idle_in_transaction_session_timeout): someone
      holds what we need, or the server is overloaded; reconnecting would not help;
    * ``unreachable``: no connection: connecting failed or timed out, the connection broke (no SQLSTATE,
      or class 08), or the server is shutting down or starting (57P01-57P03, 53300 too many clients);
    * ``error``: the server answered with any other error (a permission, a constraint, a bug).
    """
    orig = getattr(exc, "orig", None) or exc
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is None:
        return "unreachable" if _no_server_answer(exc, orig) else "error"
    return _state_of_sqlstate(sqlstate)


def _state_of_sqlstate(sqlstate: str) -> DatabaseState:
    """The server answered with ``sqlstate``: a bound we set (blocked), its going away (unreachable), or else."""
    if sqlstate in BLOCKED_SQLSTATES:
        return "blocked"
    if sqlstate in UNREACHABLE_SQLSTATES or sqlstate.startswith("08"):
        return "unreachable"
    return "error"


def _no_server_answer(exc: BaseException, orig: BaseException) -> bool:
    """A failure without a SQLSTATE that means no connection: libpq's refused / timed out / closed, the
    pool's wait for a connection, or a connection SQLAlchemy found broken."""
    import psycopg
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(orig, psycopg.OperationalError) or isinstance(exc, PoolTimeout):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def is_reconnectable(exc: BaseException) -> bool:
    """A failure that a new connection may cure (a restart or failover of the server): ``unreachable``."""
    return classify_database_error(exc) == "unreachable"


def database_problem(exc: BaseException) -> str:
    """The operator's line for a database failure, naming the state truthfully (``classify_database_error``)."""
    state = classify_database_error(exc)
    said = describe_database_error(exc)
    if state == "blocked":
        return f"the database is blocked: it answers, but a lock or statement timeout stopped us ({said})"
    if state == "unreachable":
        return f"the database does not answer ({said})"
    return f"database error ({said})"
