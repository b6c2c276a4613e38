"""Alembic from inside the package: the bundled migrations, their head, and the database's revision."""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # Passed through attributes, not the ini option, so '%' in a password needs no escaping.
        config.attributes["database_url"] = url
    return config


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the bundled migrations have {len(heads)} heads; expected exactly one")
    return heads[0]


def current_revision(conn: Connection) -> str | None:
    """The database's revision, or None when alembic never ran there."""
    exists = conn.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar_one()
    if not exists:
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version LIMIT 1")).scalar()


def is_behind(revision: str | None) -> bool:
    """True when ``revision`` is not the bundled head (older, unknown or absent)."""
    return revision != head_revision()


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
