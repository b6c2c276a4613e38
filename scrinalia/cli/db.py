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
    """Migrate DATABASE_URL up to REVISION (default: head)."""
    migrate.upgrade(get_settings().require_database_url(), revision)
    click.echo(f"database at {revision}")


@command.command("current")
def current() -> None:
    """Print the database's revision and the bundled head."""
    engine = app_engine(get_settings(), application_name="scrinalia-cli")
    with engine.connect() as conn:
        revision = migrate.current_revision(conn)
    engine.dispose()
    head = migrate.head_revision()
    click.echo(f"database: {revision or '(none)'}\nbundled head: {head}")
    if revision != head:
        raise SystemExit(1)


@command.command("runner-role")
@click.option("--role", default="scrinalia_runner", show_default=True)
@click.option("--password-env", default="RUNNER_DB_PASSWORD", show_default=True,
              help="Environment variable holding the role's password (never pass it on the command line).")
def runner_role(role: str, password_env: str) -> None:
    """Create or update the runner's least-privilege role and its grants."""
    import os

    from scrinalia.db.roles import ensure_runner_role

    password = os.environ.get(password_env)
    ensure_runner_role(app_engine(get_settings(), application_name="scrinalia-cli"), role, password)
    click.echo(f"role {role} ready" + ("" if password else f" (no password set: {password_env} is empty)"))
