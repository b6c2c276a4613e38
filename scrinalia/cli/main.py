"""The ``scrinalia`` command: one click group, one module per concept under ``scrinalia.cli``.

Each subcommand module exposes ``command`` (a click command or group). They are imported lazily so
``scrinalia users`` never pays for importing what ``scrinalia dev`` needs.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from scrinalia.db.errors import EXIT_DATABASE, database_errors, describe_database_error
from scrinalia.settings import SettingsError

SUBCOMMANDS = {
    "db": "scrinalia.cli.db",
    "archive": "scrinalia.cli.archive",
    "users": "scrinalia.cli.users",
    "dev": "scrinalia.cli.dev",
    "api": "scrinalia.cli.api",
    "scheduler": "scrinalia.cli.scheduler",
    "runs": "scrinalia.cli.runs",
    "install-units": "scrinalia.cli.install_units",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, module in SUBCOMMANDS.items() if importlib.util.find_spec(module) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(name)
        if module is None or importlib.util.find_spec(module) is None:
            return None
        return importlib.import_module(module).command


@click.group(cls=LazyGroup)
@click.version_option(package_name="scrinalia-runner")
def cli() -> None:
    """Scrinalia: the archive's database, API, workers and operations."""


def main() -> None:
    """Every subcommand's configuration and database errors end here: one line and a distinct exit
    code (2: configuration, 5: the database refused or did not answer), never a traceback."""
    try:
        cli(standalone_mode=True)
    except SettingsError as exc:
        click.echo(f"configuration error: {exc}", err=True)
        sys.exit(2)
    except database_errors() as exc:
        click.echo(f"database error: {describe_database_error(exc)}", err=True)
        sys.exit(EXIT_DATABASE)


if __name__ == "__main__":
    main()
