"""``scrinalia scheduler``: run the scheduler process, and manage schedules."""
from __future__ import annotations

import logging
import signal
import threading

import click

from scrinalia.db.engine import app_engine
from scrinalia.settings import get_settings

log = logging.getLogger("scrinalia.scheduler")


def _engine():
    from scrinalia.scheduler.service import SESSION_BOUNDS

    return app_engine(get_settings(), application_name="scrinalia-scheduler", connect_args=dict(SESSION_BOUNDS))


@click.group("scheduler")
def command() -> None:
    """Schedules and the scheduler process (exactly one is active; others stand by)."""


def _leader_engine():
    """The leader lock's own session on DATABASE_SESSION_URL (past a transaction pooler), or None."""
    from scrinalia.db.engine import create_engine_from_url
    from scrinalia.scheduler.service import SESSION_BOUNDS

    settings = get_settings()
    direct = settings.session_url()
    if direct is None:
        return None
    return create_engine_from_url(direct, settings=settings, application_name="scrinalia-scheduler-leader",
                                  pool_size=1, max_overflow=0, connect_args=dict(SESSION_BOUNDS))


@command.command("run")
@click.option("--interval", default=5.0, show_default=True, help="Seconds between ticks.")
def run(interval: float) -> None:
    """Run the scheduler until SIGTERM/SIGINT (SCHEDULER_QUARANTINE_AFTER: the crash-loop threshold).

    Refuses to start on a schema that is not its bundled head: exit 4 when it is behind (migrate first),
    7 when a newer release migrated it (upgrade this scheduler)."""
    from scrinalia.journal import setup_logging
    from scrinalia.scheduler.service import Scheduler

    setup_logging(logging.INFO, "scrinalia-scheduler", plain_format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin set-up lines are not the scheduler's news
    engine = _engine()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    revision = _schema_checked(engine, interval, stop)
    if revision is not None:
        from scrinalia.db import migrate
        from scrinalia.sdnotify import notify

        schema = "current" if revision == migrate.head_revision() else f"{revision} (newer, compatible)"
        notify("READY=1", f"STATUS=schema {schema}; ticking every {interval:g} s")
        Scheduler(engine, quarantine_after=get_settings().scheduler_quarantine_after,
                  samples_retention_days=get_settings().run_samples_retention_days,
                  leader_engine=_leader_engine()).serve(interval, stop)


def _schema_checked(engine, interval: float, stop: threading.Event) -> str | None:
    """The database's revision once the scheduler may serve on it (exits 4 or 7 when it may not). A
    database that does not answer yet is waited for, one line per try, as the ticks do: the service
    outlasts an outage, and only the schema's answer can stop it. None: stopped (SIGTERM) before the
    database answered."""
    from scrinalia.cli.schema import require_head_or_exit
    from scrinalia.db.errors import database_errors, database_problem

    while not stop.is_set():
        try:
            return require_head_or_exit(engine, "scheduler")
        except database_errors() as exc:
            log.warning("scheduler start: the schema cannot be checked: %s; retrying in %.0f s",
                        database_problem(exc), interval)
        stop.wait(interval)
    return None


@command.command("add")
@click.argument("worker")
@click.option("--every", "every", type=int, required=True, help="Interval in seconds (>= 60).")
@click.option("--request", "request_json", default="{}", help="The run request as a JSON object.")
@click.option("--by", "created_by", default=None)
def add(worker: str, every: int, request_json: str, created_by: str | None) -> None:
    """Add the schedule of WORKER (one per worker), its request validated as the API validates it.

    Exit 2, writing nothing, for an unknown worker, option, engine or preset, an out-of-range value, a
    missing required option (a model directory), or a worker that already has a schedule.
    """
    from scrinalia import bounded_json
    from scrinalia.domains.archive.errors import InvalidRunRequest
    from scrinalia.domains.archive.workers.plugins import load_catalogue
    from scrinalia.scheduler.schedules import ScheduleExists, create_schedule

    try:
        request = bounded_json.loads(request_json)
    except bounded_json.JsonRefused as exc:
        raise click.UsageError(f"--request {exc.message}") from None
    try:
        schedule = create_schedule(_engine(), worker, every, request, catalogue=load_catalogue(),
                                   created_by=created_by)
    except (InvalidRunRequest, ScheduleExists, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"schedule {schedule.id}: {worker} every {every} s, next at {schedule.next_run_at:%Y-%m-%d %H:%M:%S %Z}")


@command.command("list")
def list_() -> None:
    """List schedules."""
    from scrinalia.scheduler.schedules import list_schedules

    for s in list_schedules(_engine()):
        state = ("quarantined" if s.quarantined else "enabled" if s.enabled else "disabled")
        click.echo(f"{s.id}\t{s.worker_name}\tevery {s.interval_seconds}s\t{state}"
                   f"\tnext {s.next_run_at:%Y-%m-%d %H:%M:%S}"
                   f"\tlast {s.last_outcome or '-'}")
        if s.quarantined:
            click.echo(f"\t{s.quarantine_reason}; fingerprint {s.quarantine_fingerprint!r}; "
                       f"last run {s.quarantine_run_id}; resume: scrinalia scheduler resume {s.id}")


def _set_enabled(schedule_id: int, enabled: bool) -> None:
    from scrinalia.scheduler.schedules import set_enabled

    if set_enabled(_engine(), schedule_id, enabled) is None:
        raise click.UsageError(f"no schedule {schedule_id}")
    click.echo(f"schedule {schedule_id} {'enabled' if enabled else 'disabled'}")


@command.command("enable")
@click.argument("schedule_id", type=int)
def enable(schedule_id: int) -> None:
    """Enable a schedule."""
    _set_enabled(schedule_id, True)


@command.command("disable")
@click.argument("schedule_id", type=int)
def disable(schedule_id: int) -> None:
    """Disable a schedule; what it left QUEUED (a retry in its backoff) is cancelled, a RUNNING run is not."""
    _set_enabled(schedule_id, False)


@command.command("remove")
@click.argument("schedule_id", type=int)
def remove(schedule_id: int) -> None:
    """Remove a schedule; the runs it enqueued keep their rows."""
    from scrinalia.scheduler.schedules import delete_schedule

    if not delete_schedule(_engine(), schedule_id):
        raise click.UsageError(f"no schedule {schedule_id}")
    click.echo(f"schedule {schedule_id} removed")


@command.command("resume")
@click.argument("schedule_id", type=int)
@click.option("--by", "by", default=None, help="Who resumes it (recorded on the schedule).")
def resume(schedule_id: int, by: str | None) -> None:
    """Lift the crash-loop quarantine of a schedule and enable it again (exit 2 when it is not quarantined)."""
    from scrinalia.scheduler import quarantine

    try:
        if not quarantine.resume(_engine(), schedule_id, by=by or "cli"):
            raise click.UsageError(f"no schedule {schedule_id}")
    except quarantine.NotQuarantined as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"schedule {schedule_id} resumed")
