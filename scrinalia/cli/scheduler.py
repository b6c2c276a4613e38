"""``scrinalia scheduler``: run the scheduler process, and manage schedules."""
from __future__ import annotations

import json
import logging

import click

from scrinalia.db.engine import app_engine
from scrinalia.settings import get_settings


def _engine():
    return app_engine(get_settings(), application_name="scrinalia-scheduler")


@click.group("scheduler")
def command() -> None:
    """Schedules and the scheduler process (exactly one is active; others stand by)."""


@command.command("run")
@click.option("--interval", default=5.0, show_default=True, help="Seconds between ticks.")
def run(interval: float) -> None:
    """Run the scheduler until SIGTERM/SIGINT."""
    from scrinalia.scheduler.service import Scheduler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Scheduler(_engine()).serve(interval)


@command.command("add")
@click.argument("worker")
@click.option("--every", "every", type=int, required=True, help="Interval in seconds (>= 60).")
@click.option("--request", "request_json", default="{}", help="The run request as a JSON object.")
@click.option("--by", "created_by", default=None)
def add(worker: str, every: int, request_json: str, created_by: str | None) -> None:
    """Add a schedule for WORKER."""
    from scrinalia.domains.archive.errors import InvalidRunRequest
    from scrinalia.scheduler.schedules import create_schedule

    try:
        request = json.loads(request_json)
        schedule = create_schedule(_engine(), worker, every, request, created_by=created_by)
    except (json.JSONDecodeError, InvalidRunRequest, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"schedule {schedule.id}: {worker} every {every} s, next at {schedule.next_run_at:%Y-%m-%d %H:%M:%S %Z}")


@command.command("list")
def list_() -> None:
    """List schedules."""
    from scrinalia.scheduler.schedules import list_schedules

    for s in list_schedules(_engine()):
        state = "enabled" if s.enabled else "disabled"
        click.echo(f"{s.id}\t{s.worker_name}\tevery {s.interval_seconds}s\t{state}\tnext {s.next_run_at:%Y-%m-%d %H:%M:%S}"
                   f"\tlast {s.last_outcome or '-'}")


@command.command("disable")
@click.argument("schedule_id", type=int)
def disable(schedule_id: int) -> None:
    """Disable a schedule."""
    from scrinalia.scheduler.schedules import set_enabled

    if set_enabled(_engine(), schedule_id, False) is None:
        raise click.UsageError(f"no schedule {schedule_id}")
    click.echo(f"schedule {schedule_id} disabled")
