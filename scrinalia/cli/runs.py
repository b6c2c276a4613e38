"""``scrinalia runs show ID``: one run of the ledger, found by its id or the short id people see."""
from __future__ import annotations

import json
import sys

import click

from scrinalia.db.engine import app_engine
from scrinalia.settings import get_settings


@click.group("runs")
def command() -> None:
    """The ledger's runs."""


@command.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the run's row as JSON.")
def show(run_id: str, as_json: bool) -> None:
    """Show the run RUN_ID: a whole UUID, or the short id of the panel, the logs and ``status`` (its
    last 12 hex digits; 8 or more of its first or last digits do). Exit 1: no such run; 2: not an id,
    or a short id that several runs share (they are listed)."""
    from scrinalia.domains.archive import ledger
    from scrinalia.domains.archive.run_ids import short_id, typed_run_id

    typed = typed_run_id(run_id)
    if typed is None:
        raise click.UsageError(f"{run_id!r} is not a run id (a UUID, or 8 to 31 of its hex digits)")
    engine = app_engine(get_settings(), application_name="scrinalia-runs")
    try:
        if isinstance(typed, str):
            found = ledger.find_run_ids(engine, typed)
            if len(found) > 1:
                click.echo(f"{len(found)} runs have an id with {typed}; give more digits:", err=True)
                for candidate in found:
                    click.echo(f"  {candidate}", err=True)
                sys.exit(2)
            typed = found[0] if found else None
        run = ledger.get_run(engine, typed) if typed is not None else None
    finally:
        engine.dispose()
    if run is None:
        click.echo(f"no run {run_id}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(run.to_json(), indent=2, default=str))
        return
    click.echo(f"run {short_id(run.run_id)} ({run.run_id}) {run.worker_name}: {run.status}"
               + (f" ({run.exit_reason})" if run.exit_reason else ""))
    if run.error:
        click.echo(run.error.splitlines()[0])
