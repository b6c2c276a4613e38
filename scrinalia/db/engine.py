"""Engines: SQLAlchemy 2 Core on psycopg 3, with the TLS settings applied to every one.

``create_engine_from_url`` is the one engine factory of every process and command (the API, the
runner's parent and children, the scheduler, the CLIs, the migrations): each engine it makes checks
the server as ``DB_SSLMODE`` / ``DB_SSLROOTCERT`` say, read from the environment when the caller has
no settings at hand (decision 0051, docs/security.md "TLS to the database").

Every statement of the protocol runs in its own short transaction (``engine.begin()``), so ``now()``
is the database's clock at that statement, never a stale transaction start.
"""
from __future__ import annotations

from typing import Any, get_args

from sqlalchemy import Engine, create_engine
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
    mode = tls.db_sslmode
    url_mode = query.get("sslmode")
    if isinstance(url_mode, str) and url_mode in SSL_MODES_BY_STRENGTH and (
        SSL_MODES_BY_STRENGTH.index(url_mode) > SSL_MODES_BY_STRENGTH.index(mode)
    ):
        mode = url_mode
    args = {"sslmode": mode}
    root = tls.db_sslrootcert if tls.db_sslrootcert is not None else query.get("sslrootcert")
    if root:
        args["sslrootcert"] = str(root)
    return args


def connect_args_for(settings: DatabaseTls | None, application_name: str, url: URL | None = None) -> dict[str, Any]:
    """What the driver gets besides the URL: the application name and the TLS settings."""
    return {"application_name": application_name, **tls_connect_args(settings, url)}


def create_engine_from_url(
    url: DatabaseUrl | str,
    *,
    settings: Settings | None = None,
    application_name: str = "scrinalia",
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``; a plain string is parsed (and normalised to psycopg 3) first.

    ``settings`` also sizes the pool; without them the TLS settings are read from the environment.
    A caller's ``connect_args`` are applied last, except that they cannot weaken ``sslmode``.
    """
    parsed = url if isinstance(url, DatabaseUrl) else DatabaseUrl(url)
    if settings is not None and "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", settings.db_pool_size)
        kwargs.setdefault("max_overflow", settings.db_pool_max_overflow)
        kwargs.setdefault("pool_timeout", settings.db_pool_timeout)
    kwargs.setdefault("pool_pre_ping", True)
    connect_args = connect_args_for(settings, application_name, parsed.url)
    extra = dict(kwargs.pop("connect_args", {}))
    if extra.get("sslmode") in SSL_MODES_BY_STRENGTH and (
        SSL_MODES_BY_STRENGTH.index(extra["sslmode"]) < SSL_MODES_BY_STRENGTH.index(connect_args["sslmode"])
    ):
        extra.pop("sslmode")
    connect_args.update(extra)
    # hide_parameters: a failed statement's parameters never reach an exception message or a log.
    return create_engine(parsed.url, connect_args=connect_args, hide_parameters=True, **kwargs)


def app_engine(settings: Settings, application_name: str = "scrinalia-api", **kwargs: Any) -> Engine:
    return create_engine_from_url(
        settings.require_database_url(), settings=settings, application_name=application_name, **kwargs
    )


def runner_engine(settings: Settings, application_name: str = "scrinalia-runner", **kwargs: Any) -> Engine:
    return create_engine_from_url(
        settings.runner_url(), settings=settings, application_name=application_name, **kwargs
    )
