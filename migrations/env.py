"""Alembic environment: the URL comes from the caller's config or the application's settings, and the
engine from the application's one engine factory, so the TLS settings (DB_SSLMODE, DB_SSLROOTCERT)
apply to migrations as to every other connection (decision 0051). Works for ``scrinalia db upgrade``
(the packaged migrations) and for ``alembic upgrade head`` from a checkout (alembic.ini)."""
from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.tables import metadata
from scrinalia.settings import DatabaseUrl, load_settings

config = context.config
target_metadata = metadata


def _url() -> DatabaseUrl:
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    if url:
        return url if isinstance(url, DatabaseUrl) else DatabaseUrl(url)
    return load_settings().require_database_url()


def run_migrations_offline() -> None:
    context.configure(url=_url().url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine_from_url(_url(), application_name="scrinalia-migrate", poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
