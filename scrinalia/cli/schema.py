"""The version check a long-running ``scrinalia`` process makes before it serves: the API and the scheduler
refuse a schema that is not their bundled head, as the runner does (``runner.database.check_schema``).

Behind (an older revision, or never migrated): one line, exit 4, "migrate first". Ahead (a revision this
release does not know: a newer release migrated the database): one line, exit 7, "upgrade this API",
unless that schema declares this release compatible (decision 0392): one warning line, and it serves. Both
are in every unit's ``RestartPreventExitStatus=``: restarting cannot fix either (docs/operations.md,
"Upgrading"). A database that does not answer is the caller's usual one-line error (exit 5).
"""
from __future__ import annotations

import click
from sqlalchemy import Engine

from scrinalia.db import migrate
from scrinalia.journal import priority_line


def require_head_or_exit(engine: Engine, component: str) -> str:
    """The database's revision when this process may serve on it: the bundled head, or a schema ahead that
    declares this release compatible (decision 0392: a rollback, or the next upgrade's window), said in
    one warning line; otherwise say why on stderr and exit."""
    try:
        with engine.connect() as conn:
            revision, state = migrate.require_head(conn, component, serve_compatible=True)
    except migrate.SchemaMismatch as exc:
        click.echo(priority_line(f"error: {exc}"), err=True)
        raise SystemExit(exc.exit_code) from None
    if state == "ahead_compatible":
        click.echo(priority_line(
            f"warning: the database schema (revision {revision}) is newer than this {component} "
            f"({migrate.head_revision()}) and declares this release compatible: serving; upgrade this "
            f"{component} when you can"), err=True)
    return revision
