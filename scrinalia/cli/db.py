"""``scrinalia db``: migrate the schema (the only way it changes) and show its revision."""
from __future__ import annotations

import click

from scrinalia.db import migrate
from scrinalia.db.engine import app_engine
from scrinalia.settings import get_settings


@click.group("db")
def command() -> None:
    """Schema migrations (alembic, bundled with the package)."""


@command.command("upgrade")
@click.argument("revision", default="head")
def upgrade(revision: str) -> None:
    """Migrate DATABASE_URL up to REVISION (default: head).

    Exit 7, changing nothing, when the database is already at a revision this release does not know (a
    newer release migrated it: upgrade this installation instead); exit 2 for a REVISION that no bundled
    migration has."""
    try:
        migrate.upgrade(get_settings().require_database_url(), revision)
    except migrate.UnknownTarget as exc:
        raise click.UsageError(str(exc)) from None
    except migrate.SchemaAhead as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from None
    click.echo(f"database at {revision}")


@command.command("downgrade")
@click.argument("revision")
def downgrade(revision: str) -> None:
    """Migrate DATABASE_URL down to REVISION: the rollback of a release (docs/operations.md, "Upgrading").

    Use this release's command (the previous release cannot read revisions it does not know). What the
    later revisions added is removed; the state they moved is carried back (the lockouts). Exit 2 for a
    REVISION that no bundled migration has, 7 when the database is ahead of this release."""
    try:
        migrate.downgrade(get_settings().require_database_url(), revision)
    except migrate.UnknownTarget as exc:
        raise click.UsageError(str(exc)) from None
    except migrate.SchemaAhead as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from None
    click.echo(f"database at {revision}")


@command.command("current")
def current() -> None:
    """Print the database's revision (behind or ahead of this release) and the bundled head; exit 1 when
    they differ."""
    engine = app_engine(get_settings(), application_name="scrinalia-cli")
    with engine.connect() as conn:
        revision, state = migrate.read_schema_state(conn)
    engine.dispose()
    head = migrate.head_revision()
    said = {"current": "", "behind": " (behind this release: scrinalia db upgrade)",
            "ahead": " (ahead of this release: a newer release migrated it; upgrade this installation)",
            "ahead_compatible": " (ahead of this release: a newer release migrated it and declares this "
                                "release's API and scheduler compatible; upgrade this installation)"}[state]
    click.echo(f"database: {revision or '(none)'}{said}\nbundled head: {head}")
    if state != "current":
        raise SystemExit(1)


@command.command("runner-role")
@click.option("--role", default="scrinalia_runner", show_default=True)
@click.option("--password-env", default="RUNNER_DB_PASSWORD", show_default=True,
              help="Environment variable holding the role's password (never pass it on the command line).")
def runner_role(role: str, password_env: str) -> None:
    """Create or update the runner's least-privilege role and its grants (safe to re-run after each
    migration; run it as the schema owner). The grants: docs/security.md, "Database roles"."""
    import os

    from scrinalia.db.roles import RunnerRoleError, ensure_runner_role

    password = os.environ.get(password_env)
    engine = app_engine(get_settings(), application_name="scrinalia-cli", poolclass=None)
    try:
        report = ensure_runner_role(engine, role, password)
    except RunnerRoleError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        engine.dispose()
    click.echo(f"role {role} {'created' if report.created else 'updated'}"
               + (f" ({', '.join(report.altered)})" if report.altered else "")
               + ("" if password else f"; no password set ({password_env} is empty)"))
    if report.connect_revoked:
        click.echo(f"PUBLIC may no longer connect to: {', '.join(report.connect_revoked)}")
    if not report.temp_revoked:
        click.echo("warning: the role may still create temporary tables (PUBLIC holds TEMP on this database "
                   "and only its owner can revoke it: REVOKE TEMPORARY ON DATABASE ... FROM PUBLIC)", err=True)
    if report.still_connects:
        click.echo(f"note: the role may also connect to {', '.join(report.still_connects)} (PUBLIC's CONNECT); "
                   "allow it only this database in pg_hba.conf (docs/security.md)", err=True)
