"""Engines: SQLAlchemy 2 Core on psycopg 3, with the TLS settings applied to every one.

``create_engine_from_url`` is the one engine factory of every process and command (the API, the
runner's parent and children, the scheduler, the CLIs, the migrations): each engine it makes checks
the server as ``DB_SSLMODE`` / ``DB_SSLROOTCERT`` say, read from the environment when the caller has
no settings at hand (decision 0051, docs/security.md "TLS to the database").

Every statement of the protocol runs in its own transaction, so ``now()`` is the database's clock at
that statement, never a stale transaction start. A single-statement step runs through
``one_statement``: the connection is in autocommit while it is checked out, so the server sees the
statement alone (its own implicit transaction) instead of BEGIN + statement + COMMIT, three round trips
(decision 0070). A multi-statement transaction (the workers' fenced commit) still uses ``engine.begin()``.

Nothing depends on session state that a transaction pooler (PgBouncer in transaction mode) drops
(decision 0121): no connection prepares statements on the server (``prepare_threshold=None``), and the
session bounds a caller gives in ``options`` (``statement_timeout``, ``lock_timeout``,
``idle_in_transaction_session_timeout``) are also sent at the start of every transaction, in the same
round trip as its first statement, on every connection whose session turns out not to hold them
(``bounded_cursor_class``).
"""
from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, get_args

import psycopg
from psycopg import pq
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL

from scrinalia.settings import DatabaseTls, DatabaseUrl, Settings, SSLMode, load_tls

#: libpq's sslmode values from the weakest to the strictest.
SSL_MODES_BY_STRENGTH: tuple[str, ...] = get_args(SSLMode)


def tls_connect_args(tls: DatabaseTls | None = None, url: URL | None = None) -> dict[str, str]:
    """``sslmode`` and ``sslrootcert`` for a connection.

    The environment's settings (``tls``, or read now) always apply; a URL that asks for a stricter
    ``sslmode`` in its query keeps it, so a setting never weakens what a URL demands. ``DB_SSLROOTCERT``
    wins over a URL's ``sslrootcert``.
    """
    tls = tls if tls is not None else load_tls()
    query = dict(url.query) if url is not None else {}
    mode: str = tls.db_sslmode
    url_mode = query.get("sslmode")
    if isinstance(url_mode, str) and url_mode in SSL_MODES_BY_STRENGTH and (
        SSL_MODES_BY_STRENGTH.index(url_mode) > SSL_MODES_BY_STRENGTH.index(mode)
    ):
        mode = url_mode
    args: dict[str, str] = {"sslmode": mode}
    root = tls.db_sslrootcert if tls.db_sslrootcert is not None else query.get("sslrootcert")
    if root:
        args["sslrootcert"] = str(root)
    return args


#: libpq's side of a dead peer (decision 0102): TCP keepalives on an idle connection (the first probe
#: after 5 s of silence, then every 2 s, given up after 3 unanswered: about 11 s) and a bound on data
#: left unacknowledged (10 s), so a client whose server host died learns it in seconds, not hours.
#: A caller's ``connect_args`` may set shorter ones (the runner's parent sets its own tcp_user_timeout).
KEEPALIVE_CONNECT_ARGS: dict[str, int] = {
    "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
#: The server's side, sent as session settings (any role may set them): a backend whose client host
#: died (frozen, powered off, cut off by the network) is found dead the same way, so its transaction is
#: rolled back and its locks are released within seconds instead of after the kernel's 2 h default.
KEEPALIVE_SERVER_OPTIONS = ("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
                            " -c tcp_user_timeout=10000")


def merge_options(*options: str | None) -> str:
    """libpq ``options`` strings joined (a later ``-c name=value`` wins over an earlier one)."""
    return " ".join(o.strip() for o in options if o and o.strip())


#: The session bounds that ``options`` may carry and that a transaction pooler would drop with it.
SESSION_BOUND_SETTINGS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
_BOUND_OPTION = re.compile(r"-c\s*(" + "|".join(SESSION_BOUND_SETTINGS) + r")=(\S+)")
_BOUND_VALUE = re.compile(r"^\d+(ms|s|min|h)?$")


def session_bounds_in(options: str | None) -> dict[str, str]:
    """The bounds a libpq ``options`` string sets (``-c statement_timeout=800``; a later one wins)."""
    bounds: dict[str, str] = {}
    for name, value in _BOUND_OPTION.findall(options or ""):
        if not _BOUND_VALUE.match(value):
            raise ValueError(f"{name}={value!r}: a session bound is a number of ms (or with a unit)")
        bounds[name] = value
    return bounds


def bounds_statement(bounds: dict[str, str]) -> str:
    """The statement that puts ``bounds`` in force for the current transaction only (``set_config``
    with is_local: what SET LOCAL does, without its warning outside an explicit block). The values are
    checked by ``session_bounds_in``: digits and a unit, nothing to quote."""
    calls = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in bounds.items())
    return f"SELECT {calls}"


def bounds_check_statement(bounds: dict[str, str]) -> str:
    """True when the session already runs under ``bounds`` (libpq's ``options`` reached the server)."""
    def interval(value: str) -> str:
        return f"interval '{value}ms'" if value.isdigit() else f"interval '{value}'"

    checks = " AND ".join(f"current_setting('{name}')::interval = {interval(value)}" for name, value in bounds.items())
    return f"SELECT {checks}"


#: Per connection: does its session hold the bounds itself (a direct one: libpq's options took effect)?
_SESSION_HOLDS_BOUNDS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


@functools.cache
def bounded_cursor_class(bounds: tuple[tuple[str, str], ...]) -> type[psycopg.Cursor[Any]]:
    """A psycopg cursor class that puts ``bounds`` in force at the start of every transaction of a
    connection whose session lacks them (decision 0121), in one pipeline with the transaction's first
    statement: one round trip, as before (decision 0070), whatever server session a pooler lends.

    The first transaction of each connection also asks, in the same pipeline and before the bounds,
    whether the session already holds them (``options`` reached the server: a direct connection, or a
    pooler that passes it). If it does, later transactions are sent as they are: no extra statement on
    a direct connection. Otherwise (a pooler dropped ``options``: the session is any server session)
    every transaction carries them. In autocommit the server runs the pipeline's statements as one
    implicit transaction ending at its Sync, so the local settings end with the step."""
    as_dict = dict(bounds)
    apply_sql, check_sql = bounds_statement(as_dict).encode(), bounds_check_statement(as_dict).encode()

    class BoundedCursor(psycopg.Cursor[Any]):
        def _bounds_needed(self) -> bool:
            conn = self.connection
            info = conn.info
            return (info.transaction_status == pq.TransactionStatus.IDLE
                    and info.pipeline_status == pq.PipelineStatus.OFF and not _SESSION_HOLDS_BOUNDS.get(conn, False))

        def _send_bounds(self) -> psycopg.Cursor[Any] | None:
            """Inside the pipeline: the check (first transaction only), then the bounds."""
            check = None
            if self.connection not in _SESSION_HOLDS_BOUNDS:
                check = psycopg.Cursor(self.connection)
                check.execute(check_sql, prepare=False)
            psycopg.Cursor(self.connection).execute(apply_sql, prepare=False)
            return check

        def _learn(self, check: psycopg.Cursor[Any] | None) -> None:
            if check is not None:
                row = check.fetchone()
                _SESSION_HOLDS_BOUNDS[self.connection] = bool(row and row[0])

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                    binary: bool | None = None) -> BoundedCursor:
            if not self._bounds_needed():
                super().execute(query, params, prepare=prepare, binary=binary)
                return self
            with self.connection.pipeline():
                check = self._send_bounds()
                super().execute(query, params, prepare=prepare, binary=binary)
            self._learn(check)
            return self

        def executemany(self, query: Any, params_seq: Any, *, returning: bool = False) -> None:
            if not self._bounds_needed():
                super().executemany(query, params_seq, returning=returning)
                return
            with self.connection.pipeline():
                check = self._send_bounds()
                super().executemany(query, params_seq, returning=returning)
            self._learn(check)

    return BoundedCursor


def connect_args_for(settings: DatabaseTls | None, application_name: str, url: URL | None = None) -> dict[str, Any]:
    """What the driver gets besides the URL: the application name and the TLS settings."""
    return {"application_name": application_name, **tls_connect_args(settings, url)}


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What SQLAlchemy's dialect asks the first connection of every new engine (``initialize``:
    ``select pg_catalog.version()``, ``select current_schema()``, ``show transaction isolation level``,
    ``show standard_conforming_strings``, each wrapped in BEGIN/ROLLBACK). A process that already knows
    the answers (a runner's child, told by its supervisor, which asked the same server as the same
    role) hands them to its engine, so its first connection sends nothing but its own statements."""

    server_version_info: tuple[int, ...]
    default_schema_name: str | None
    default_isolation_level: str
    backslash_escapes: bool

    @classmethod
    def of(cls, engine: Engine) -> ServerFacts | None:
        """The facts an initialised engine learned; None before its first connection."""
        dialect: Any = engine.dialect
        if dialect.server_version_info is None:
            return None
        return cls(tuple(dialect.server_version_info), dialect.default_schema_name,
                   dialect.default_isolation_level, bool(dialect._backslash_escapes))

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ServerFacts:
        return cls(tuple(value["server_version_info"]), value["default_schema_name"],
                   value["default_isolation_level"], bool(value["backslash_escapes"]))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def adopt(self, engine: Engine) -> None:
        """Make ``engine``'s dialect answer its first-connect questions from these facts. The dialect's
        own ``initialize`` still runs (so every flag it derives is derived as usual); only the four
        queries are answered here."""
        dialect: Any = engine.dialect
        dialect._get_server_version_info = lambda connection: self.server_version_info
        dialect._get_default_schema_name = lambda connection: self.default_schema_name
        dialect.get_default_isolation_level = lambda dbapi_connection: self.default_isolation_level

        def backslash_escapes(connection: Any) -> None:
            dialect._backslash_escapes = self.backslash_escapes

        dialect._set_backslash_escapes = backslash_escapes


def create_engine_from_url(
    url: DatabaseUrl | str,
    *,
    settings: Settings | None = None,
    application_name: str = "scrinalia",
    server_facts: ServerFacts | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``; a plain string is parsed (and normalised to psycopg 3) first.

    ``settings`` also sizes the pool; without them the TLS settings are read from the environment.
    A caller's ``connect_args`` are applied last, except that they cannot weaken ``sslmode``.
    ``server_facts``: what the dialect would ask on the first connection, already known (see
    ``ServerFacts``)."""
    parsed = url if isinstance(url, DatabaseUrl) else DatabaseUrl(url)
    if settings is not None and "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", settings.db_pool_size)
        kwargs.setdefault("max_overflow", settings.db_pool_max_overflow)
        kwargs.setdefault("pool_timeout", settings.db_pool_timeout)
    kwargs.setdefault("pool_pre_ping", True)
    # No hstore column exists: skip the dialect's hstore type lookup on the first connection.
    kwargs.setdefault("use_native_hstore", False)
    connect_args = connect_args_for(settings, application_name, parsed.url)
    extra = dict(kwargs.pop("connect_args", {}))
    if extra.get("sslmode") in SSL_MODES_BY_STRENGTH and (
        SSL_MODES_BY_STRENGTH.index(extra["sslmode"]) < SSL_MODES_BY_STRENGTH.index(connect_args["sslmode"])
    ):
        extra.pop("sslmode")
    options = merge_options(KEEPALIVE_SERVER_OPTIONS, extra.pop("options", None))
    connect_args.update(KEEPALIVE_CONNECT_ARGS)
    connect_args.update(extra)
    connect_args["options"] = options
    # No server-side prepared statements: a transaction pooler hands the next transaction another
    # server session, where "_pg3_0" does not exist (or another client's does). Decision 0121.
    connect_args["prepare_threshold"] = None
    bounds = session_bounds_in(options)
    if bounds:
        connect_args["cursor_factory"] = bounded_cursor_class(tuple(bounds.items()))
    # hide_parameters: a failed statement's parameters never reach an exception message or a log.
    engine = create_engine(parsed.url, connect_args=connect_args, hide_parameters=True, **kwargs)
    if server_facts is not None:
        server_facts.adopt(engine)
    return engine


def app_engine(settings: Settings, application_name: str = "scrinalia-api", **kwargs: Any) -> Engine:
    return create_engine_from_url(
        settings.require_database_url(), settings=settings, application_name=application_name, **kwargs
    )


def runner_engine(settings: Settings, application_name: str = "scrinalia-runner", **kwargs: Any) -> Engine:
    return create_engine_from_url(
        settings.runner_url(), settings=settings, application_name=application_name, **kwargs
    )


@contextmanager
def one_statement(engine: Engine | Connection) -> Iterator[Connection]:
    """A pooled connection in autocommit, for ONE statement (a protocol step or a single read).

    PostgreSQL runs a statement sent outside a transaction block in its own transaction, so the step
    keeps its atomicity and its ``now()`` while costing one round trip. psycopg's autocommit is a client
    flag (setting it sends nothing), and SQLAlchemy restores the pool's default isolation on check-in.
    Never run two statements that must commit together through this. Given a Connection (a caller that
    reads many things on one connection, e.g. the workers screen), the statement runs on it as it is.
    """
    if isinstance(engine, Connection):
        yield engine
        return
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn
