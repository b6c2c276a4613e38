"""``scrinalia users``: create, list, set-role, reset-password, deactivate (and activate).

Passwords are read from a prompt (hidden, confirmed) or, for scripts, from standard input with
``--password-stdin``; never from an argument, which would land in the shell history and in ``ps``.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click
from sqlalchemy import Engine

from scrinalia.db.engine import app_engine
from scrinalia.domains.identity import users as identity_users
from scrinalia.domains.identity.errors import InvalidUserInput, UserExists, UserNotFound
from scrinalia.settings import get_settings

T = TypeVar("T")


def _engine():
    return app_engine(get_settings(), application_name="scrinalia-cli", poolclass=None)


def _min_length() -> int:
    from scrinalia.api.settings import load_api_settings

    return load_api_settings().password_min_length


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            raise click.UsageError("no password on standard input")
        return value
    return click.prompt("Password", hide_input=True, confirmation_prompt=True)


def _fail(exc: Exception, code: int = 1) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(code)


def _with_engine(action: Callable[[Engine], T], *expected: type[Exception]) -> T:
    """``action`` on a fresh engine, disposed after; an ``expected`` error is one line and exit 1."""
    engine = _engine()
    try:
        return action(engine)
    except expected as exc:
        _fail(exc)
    finally:
        engine.dispose()


@click.group("users")
def command() -> None:
    """Users of the API and the panel (roles ADMIN, CURATOR, VIEWER)."""


@command.command("create")
@click.argument("email")
@click.option("--role", type=click.Choice(["ADMIN", "CURATOR", "VIEWER"], case_sensitive=False), default="VIEWER",
              show_default=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (one line)")
@click.option("--must-change-password/--no-must-change-password", default=False,
              help="Force a password change at the first login")
def create(email: str, role: str, password_stdin: bool, must_change_password: bool) -> None:
    """Create a user."""
    password = _read_password(password_stdin)
    min_length = _min_length()
    user = _with_engine(lambda engine: identity_users.create_user(
        engine, email, password, role, must_change_password=must_change_password, min_length=min_length,
    ), InvalidUserInput, UserExists)
    click.echo(f"created {user.email} ({user.role})")


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for scripts")
def list_(as_json: bool) -> None:
    """List users (never their password hashes)."""
    users = _with_engine(identity_users.list_users)
    if as_json:
        click.echo(json.dumps([u.to_json() for u in users], indent=2))
        return
    if not users:
        click.echo("no users")
        return
    click.echo(f"{'EMAIL':40} {'ROLE':8} {'ACTIVE':6} {'MUST-CHANGE':11} {'LOCKED-UNTIL':25} LAST-LOGIN")
    for u in users:
        click.echo(
            f"{u.email:40} {u.role:8} {'yes' if u.is_active else 'no':6} "
            f"{'yes' if u.must_change_password else 'no':11} "
            f"{(u.locked_until.isoformat(timespec='seconds') if u.locked_until else '-'):25} "
            f"{u.last_login_at.isoformat(timespec='seconds') if u.last_login_at else '-'}"
        )


@command.command("set-role")
@click.argument("email")
@click.argument("role", type=click.Choice(["ADMIN", "CURATOR", "VIEWER"], case_sensitive=False))
def set_role(email: str, role: str) -> None:
    """Change a user's role."""
    user = _with_engine(lambda engine: identity_users.set_role(engine, email, role), InvalidUserInput, UserNotFound)
    click.echo(f"{user.email} is now {user.role}")


@command.command("reset-password")
@click.argument("email")
@click.option("--password-stdin", is_flag=True, help="Read the new password from standard input (one line)")
@click.option("--must-change-password/--no-must-change-password", default=True, show_default=True,
              help="Force a change at the next login")
def reset_password(email: str, password_stdin: bool, must_change_password: bool) -> None:
    """Set a new password, clear the lockout and revoke every session of the user."""
    password = _read_password(password_stdin)
    min_length = _min_length()
    user = _with_engine(lambda engine: identity_users.reset_password(
        engine, email, password, must_change_password=must_change_password, min_length=min_length,
    ), InvalidUserInput, UserNotFound)
    click.echo(f"password of {user.email} reset; sessions revoked"
               + ("; it must be changed at the next login" if must_change_password else ""))


@command.command("deactivate")
@click.argument("email")
def deactivate(email: str) -> None:
    """Deactivate a user and revoke their sessions (the row and its history stay)."""
    user = _with_engine(lambda engine: identity_users.deactivate(engine, email), UserNotFound)
    click.echo(f"{user.email} deactivated; sessions revoked")


@command.command("activate")
@click.argument("email")
def activate(email: str) -> None:
    """Re-activate a deactivated user."""
    user = _with_engine(lambda engine: identity_users.activate(engine, email), UserNotFound)
    click.echo(f"{user.email} activated")
