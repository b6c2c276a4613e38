"""``scrinalia runs show ID``: one run of the ledger, found by its id or the short id people see."""
from __future__ import annotations

import json
import sys
import uuid
from typing import TYPE_CHECKING

import click

from scrinalia.db.engine import app_engine
from scrinalia.settings import get_settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from scrinalia.domains.archive.ledger import WorkerRun


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
    from scrinalia.domains.archive.run_ids import typed_run_id

    typed = typed_run_id(run_id)
    if typed is None:
        raise click.UsageError(f"{run_id!r} is not a run id (a UUID, or 8 to 31 of its hex digits)")
    engine = app_engine(get_settings(), application_name="scrinalia-runs")
    try:
        run = _find_run(engine, typed)
    finally:
        engine.dispose()
    if run is None:
        click.echo(f"no run {run_id}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(run.to_json(), indent=2, default=str))
        return
    _echo_summary(run)


def _find_run(engine: Engine, typed: uuid.UUID | str) -> WorkerRun | None:
    """The run of a whole UUID, or of the digits only one run's id has; digits that several runs' ids
    have are an error naming them (exit 2): showing one of them would be a guess."""
    from scrinalia.domains.archive import ledger

    if isinstance(typed, str):
        found = ledger.find_run_ids(engine, typed)
        if len(found) > 1:
            click.echo(f"{len(found)} runs have an id with {typed}; give more digits:", err=True)
            for candidate in found:
                click.echo(f"  {candidate}", err=True)
            sys.exit(2)
        if not found:
            return None
        typed = found[0]
    return ledger.get_run(engine, typed)


def _echo_summary(run: WorkerRun) -> None:
    """The run in one line (short id, id, worker, status and why it ended), then its error's first line."""
    from scrinalia.domains.archive.run_ids import short_id

    click.echo(f"run {short_id(run.run_id)} ({run.run_id}) {run.worker_name}: {run.status}"
               + (f" ({run.exit_reason})" if run.exit_reason else ""))
    if run.error:
        click.echo(run.error.splitlines()[0])
