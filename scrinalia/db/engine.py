"""Engines: SQLAlchemy 2 Core on psycopg 3, with TLS options from the settings.

Every statement of the protocol runs in its own short transaction (``engine.begin()``), so ``now()``
is the database's clock at that statement, never a stale transaction start.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine

from scrinalia.settings import DatabaseUrl, Settings


def connect_args_for(settings: Settings | None, application_name: str) -> dict[str, Any]:
    args: dict[str, Any] = {"application_name": application_name}
    if settings is not None:
        args["sslmode"] = settings.db_sslmode
        if settings.db_sslrootcert is not None:
            args["sslrootcert"] = str(settings.db_sslrootcert)
    return args


def create_engine_from_url(
    url: DatabaseUrl | str,
    *,
    settings: Settings | None = None,
    application_name: str = "scrinalia",
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``; a plain string is parsed (and normalised to psycopg 3) first."""
    parsed = url if isinstance(url, DatabaseUrl) else DatabaseUrl(url)
    if settings is not None and "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", settings.db_pool_size)
        kwargs.setdefault("max_overflow", settings.db_pool_max_overflow)
        kwargs.setdefault("pool_timeout", settings.db_pool_timeout)
    kwargs.setdefault("pool_pre_ping", True)
    connect_args = connect_args_for(settings, application_name)
    connect_args.update(kwargs.pop("connect_args", {}))
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
