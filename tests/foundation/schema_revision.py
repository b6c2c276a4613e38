"""A database set as another release leaves it, for the version check's tests: its revision, and the oldest
revision whose code it declares may still run on it (decision 0392)."""
from __future__ import annotations

from functools import lru_cache

from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from scrinalia.db import migrate


@lru_cache(maxsize=1)
def head_declaration() -> str:
    """What the bundled head declares: the ``OLDEST_COMPATIBLE`` of the newest migration that sets one."""
    for script in ScriptDirectory.from_config(migrate.alembic_config()).walk_revisions():  # the head first
        declared = getattr(script.module, "OLDEST_COMPATIBLE", None)
        if declared is not None:
            return str(declared)
    raise AssertionError("no migration declares OLDEST_COMPATIBLE")


def set_revision(engine: Engine, revision: str, oldest_compatible: str | None = None) -> None:
    """The database at ``revision``. A revision these migrations do not know is a newer release's, which
    declares ``oldest_compatible`` (by default itself: nothing this code knows); a known one gets the
    head's declaration back."""
    if revision in migrate.known_revisions():
        declared = head_declaration()
    else:
        declared = oldest_compatible or revision
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
        conn.execute(text(f"CREATE OR REPLACE FUNCTION scrinalia_schema_oldest_compatible() RETURNS text "
                          f"LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '{declared}'::text $$"))
