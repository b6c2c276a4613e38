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
