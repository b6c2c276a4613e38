"""Alembic from inside the package: the bundled migrations, their head, and the database's revision."""
from __future__ import annotations

from functools import lru_cache

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from scrinalia.bundled import migrations_dir
from scrinalia.settings import DatabaseUrl


def alembic_config(url: DatabaseUrl | str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        # Passed through attributes, not the ini option, so '%' in a password needs no escaping.
        config.attributes["database_url"] = url
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The bundled head. Cached: the migrations on disk do not change under a running process, and
    reading them parses every revision file."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the bundled migrations have {len(heads)} heads; expected exactly one")
    return heads[0]


@lru_cache(maxsize=1)
def known_revisions() -> frozenset[str]:
    """Every revision of the bundled migrations: a database revision outside it is ahead of this code."""
    return frozenset(r.revision for r in ScriptDirectory.from_config(alembic_config()).walk_revisions())


def current_revision(conn: Connection) -> str | None:
    """The database's revision, or None when alembic never ran there."""
    exists = conn.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar_one()
    if not exists:
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version LIMIT 1")).scalar()


def upgrade(url: DatabaseUrl | str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: DatabaseUrl | str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
