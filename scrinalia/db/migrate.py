"""Alembic from inside the package: the bundled migrations, their head, the database's revision, and the
version check every long-running process makes at start (the runner, the API, the scheduler).

The check tells the truth in both directions (docs/operations.md, "Upgrading"):

* the database is at an older revision of these migrations (or was never migrated): the schema is
  *behind* the code, ``SchemaBehind``, exit code 4: migrate first;
* the database is at a revision these migrations do not know: a newer release migrated it, the schema
  is *ahead* of the code, ``SchemaAhead``, exit code 7: this process is the one to upgrade. Migrating
  with this release cannot help (alembic cannot go from a revision it does not have), so ``upgrade``
  refuses it too, in one line, instead of alembic's traceback.

A schema ahead may declare earlier code compatible (decision 0392): ``scrinalia_schema_oldest_compatible()``
names the oldest revision whose code may still run on it. When this code knows that revision, the schema
is *ahead but compatible*: the API and the scheduler serve on it (a rollback of those two, the previous
API through the next upgrade's window); the runner, whose statements are the ledger's protocol, still
refuses it.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Literal

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, NullPool, text

from scrinalia.bundled import migrations_dir
from scrinalia.db.engine import create_engine_from_url
from scrinalia.settings import DatabaseUrl

#: The exit code of a process that refuses a schema behind its code (``scrinalia db upgrade`` first).
EXIT_SCHEMA_BEHIND = 4
#: The exit code of a process that refuses a schema ahead of its code (upgrade the process).
EXIT_SCHEMA_AHEAD = 7

SchemaState = Literal["current", "behind", "ahead", "ahead_compatible"]


class SchemaMismatch(RuntimeError):
    """The database's revision is not the bundled head; ``component`` names who refuses ("runner",
    "API", "scheduler"), so the message says what to do with which process."""

    exit_code: int

    def __init__(self, current: str | None, head: str, component: str, message: str) -> None:
        self.current, self.head, self.component = current, head, component
        super().__init__(message)


class SchemaBehind(SchemaMismatch):
    exit_code = EXIT_SCHEMA_BEHIND

    def __init__(self, current: str | None, head: str, component: str = "runner") -> None:
        super().__init__(
            current, head, component,
            f"the database schema is at revision {current or '(none: never migrated)'} but this {component} "
            f"needs {head}; migrate first with `scrinalia db upgrade` (deploy order: migrate -> API -> runner)",
        )


class SchemaAhead(SchemaMismatch):
    exit_code = EXIT_SCHEMA_AHEAD

    def __init__(self, current: str, head: str, component: str = "runner") -> None:
        super().__init__(
            current, head, component,
            f"this {component} is older than the database's schema (revision {current}); upgrade this "
            f"{component} (its newest revision is {head})",
        )


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


def oldest_compatible(conn: Connection) -> str | None:
    """The oldest revision whose code the database's schema says may still run on it (decision 0392), or
    None where the schema predates the declaration (migration 0021)."""
    declared = conn.execute(text("SELECT to_regprocedure('scrinalia_schema_oldest_compatible()') IS NOT NULL"))
    if not declared.scalar_one():
        return None
    return conn.execute(text("SELECT scrinalia_schema_oldest_compatible()")).scalar_one()


def schema_state(current: str | None, oldest: str | None = None) -> SchemaState:
    """Where the database's revision stands against this code's migrations; ``oldest``: what the schema
    declares (``oldest_compatible``), which a schema ahead is read with."""
    if current == head_revision():
        return "current"
    if current is None or current in known_revisions():
        return "behind"
    return "ahead_compatible" if oldest is not None and oldest in known_revisions() else "ahead"


def declared_state(conn: Connection, current: str | None) -> SchemaState:
    """Where the database's revision ``current`` stands, a schema ahead read with its declaration."""
    state = schema_state(current)
    return schema_state(current, oldest_compatible(conn)) if state == "ahead" else state


def read_schema_state(conn: Connection, *, declared: bool = True) -> tuple[str | None, SchemaState]:
    """The database's revision and where it stands; a schema ahead is read with its declaration unless
    ``declared`` is False (then it is "ahead" whatever it says)."""
    current = current_revision(conn)
    return current, declared_state(conn, current) if declared else schema_state(current)


def require_head(conn: Connection, component: str, *, serve_compatible: bool = False) -> tuple[str, SchemaState]:
    """The database's revision and its state when this code may run on it: the bundled head, or (with
    ``serve_compatible``: the API, the scheduler) a schema ahead that declares this code compatible. Else
    ``SchemaBehind`` or ``SchemaAhead``."""
    current, state = read_schema_state(conn, declared=serve_compatible)
    if state == "behind":
        raise SchemaBehind(current, head_revision(), component)
    if state == "ahead":
        assert current is not None
        raise SchemaAhead(current, head_revision(), component)
    assert current is not None
    return current, state


class UnknownTarget(ValueError):
    """``scrinalia db upgrade REVISION`` names a revision these migrations do not have."""


def upgrade(url: DatabaseUrl | str, revision: str = "head") -> None:
    """Migrate up to ``revision``. Refuses, before alembic runs, a target these migrations do not have
    (``UnknownTarget``) and a database already at a revision they do not know (``SchemaAhead``: a newer
    release migrated it); a database behind is migrated as usual. The revision is read on the connection
    the migrations then run on, in their transaction."""
    _migrate(url, revision, command.upgrade, allowed_targets=("head",))


def downgrade(url: DatabaseUrl | str, revision: str = "base") -> None:
    """Migrate down to ``revision`` (a revision of these migrations, or "base"), with the refusals of
    ``upgrade``: a rollback is made with the code of the release that migrated the database up."""
    _migrate(url, revision, command.downgrade, allowed_targets=("base",))


def _migrate(url: DatabaseUrl | str, revision: str, run: Callable[[Config, str], None],
             allowed_targets: tuple[str, ...]) -> None:
    if revision not in allowed_targets and revision not in known_revisions():
        raise UnknownTarget(f"no migration has the revision {revision!r} (the bundled head is {head_revision()})")
    engine = create_engine_from_url(url, application_name="scrinalia-migrate", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            current = current_revision(conn)
            if schema_state(current) == "ahead":  # compatible or not: alembic cannot start from it
                assert current is not None
                raise SchemaAhead(current, head_revision(), "release")
            config = alembic_config(url)
            config.attributes["connection"] = conn
            run(config, revision)
            conn.commit()
    finally:
        engine.dispose()
