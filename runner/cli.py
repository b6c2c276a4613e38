"""``scrinalia-runner``: ``daemon`` (the supervisor), ``status`` (ask it), ``run`` (the one-shot runner).

Exit codes are in ``runner.options`` (EXIT_*) and docs/operations.md ("Runner").
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from runner import options as opts
from runner.options import OptionsError

log = logging.getLogger("scrinalia.runner")


def setup_logging(level: str) -> None:
    """Plain lines on stderr; under systemd the journal, with priorities and the run's fields
    (scrinalia.journal)."""
    from scrinalia.journal import setup_logging as setup

    setup(level, "scrinalia-runner")
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _settings():
    from scrinalia.settings import SettingsError, load_settings

    try:
        return load_settings()
    except SettingsError as exc:
        opts.exit_with(opts.EXIT_USAGE, f"configuration error: {exc}")


def _parent_settings():
    """What a parent (daemon or one-shot) needs before anything else: the torch import guard armed,
    the settings and the runner's database URL. Exits with a clear message when one is wrong."""
    from runner.guard import HeavyImportForbidden, forbid_heavy_imports

    try:
        forbid_heavy_imports()
    except HeavyImportForbidden as exc:
        opts.exit_with(1, str(exc))
    settings = _settings()
    try:
        return settings, settings.runner_url()
    except Exception as exc:
        opts.exit_with(opts.EXIT_USAGE, f"configuration error: {exc}")


@click.group()
@click.version_option(package_name="scrinalia-runner")
def cli() -> None:
    """The GPU host's runner: a supervisor with one child process per claimed run."""


# --- daemon ---------------------------------------------------------------------------------------

DAEMON_HELP = """Claim QUEUED runs and run each in its own child process (the supervisor).

The database comes from RUNNER_DATABASE_URL, else DATABASE_URL (DB_SSLMODE, DB_SSLROOTCERT for TLS).
SIGTERM/SIGINT drain (stop claiming, wait up to --drain-timeout, then stop the rest: INTERRUPTED
runner-stopped); a second one stops now.
"""


def daemon_options(func):
    decorators = [
        click.option("--name", required=True, help="This runner's name in the registry (and its socket's)."),
        click.option("--capabilities", default=None,
                     help="Comma-separated workers to claim (default: every worker of the catalogue)."),
        click.option("--concurrency", type=int, default=1, show_default=True, help="Children at most."),
        click.option("--devices", default="auto", show_default=True,
                     help="The GPUs this runner owns: auto (every device NVML lists; none without NVML), none "
                          "(children see no GPU: GPU workers run on CPU), or indexes/UUIDs (0,1 or GPU-...). "
                          "Each child gets one device as CUDA_VISIBLE_DEVICES; a GPU worker is claimed only "
                          "while a device slot is free."),
        click.option("--per-device", type=int, default=1, show_default=True,
                     help="Children that may share one device."),
        click.option("--heartbeat", type=float, default=15.0, show_default=True, help="Seconds between heartbeats."),
        click.option("--lease", type=float, default=60.0, show_default=True,
                     help="Seconds a heartbeat renews the leases for; must exceed --heartbeat."),
        click.option("--poll", type=float, default=2.0, show_default=True,
                     help="Seconds between claims when no notification is heard."),
        click.option("--listen/--no-listen", default=None,
                     help="Claim as soon as the ledger announces a QUEUED run (LISTEN/NOTIFY); default on, "
                          "or SCRINALIA_RUNNER_LISTEN=0 to turn it off."),
        click.option("--listen-poll", type=float, default=10.0, show_default=True,
                     help="Seconds between claims while listening: the safety net for a lost notification."),
        click.option("--drain-timeout", type=float, default=120.0, show_default=True,
                     help="Seconds a drain waits for the children before stopping them."),
        click.option("--max-runtime", type=float, default=None, help="Seconds a run may take (then FAILED timeout)."),
        click.option("--cancel-grace", type=float, default=60.0, show_default=True,
                     help="Seconds after a cancel request before SIGTERM/SIGKILL (cancel-forced)."),
        click.option("--kill-grace", type=float, default=5.0, show_default=True,
                     help="Seconds between SIGTERM and SIGKILL when the supervisor stops a child."),
        click.option("--stall-timeout", type=float, default=opts.DEFAULT_STALL_TIMEOUT, show_default=True,
                     help="Seconds a running child may send nothing and use no CPU before its Python stack is "
                          "dumped and it is stopped (FAILED stalled); a worker may declare its own "
                          "(WorkerSpec.stall_timeout). 0: never."),
        click.option("--preload", default=",".join(opts.DEFAULT_PRELOAD), show_default=True,
                     help="Modules the fork server imports once ('none' for nothing); skipped when not installed."),
        click.option("--warm-models", default="auto", show_default=True,
                     help="Models the fork server loads once on the CPU for its children (copy-on-write): "
                          "auto (the bundled model when a worker that uses it is served and transformers is "
                          "preloaded), none, or DIR[:DTYPE],... (decision 0340)."),
        click.option("--warm-limit-mb", type=int, default=opts.DEFAULT_WARM_LIMIT_MB, show_default=True,
                     help="MiB of warm models the fork server may hold (the oldest is dropped first); 0: none."),
        click.option("--standby/--no-standby", default=True, show_default=True,
                     help="The fork server keeps a child forked ahead, handed the next run directly "
                          "(pick-up without the fork's time; decision 0341)."),
        click.option("--start-method", type=click.Choice(opts.START_METHODS), default="forkserver", show_default=True,
                     help="forkserver (children ready in milliseconds) or spawn (a fresh interpreter per child)."),
        click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None,
                     help="The control socket (default: $RUNTIME_DIRECTORY or $XDG_RUNTIME_DIR/scrinalia-runner "
                          "or /run/scrinalia-runner, then NAME.sock)."),
        click.option("--log-level", default="INFO", show_default=True),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@cli.command("daemon", help=DAEMON_HELP)
@daemon_options
def daemon_command(**flags: Any) -> None:
    sys.exit(run_daemon(**flags))


def run_daemon(*, name, capabilities, concurrency, devices, per_device, heartbeat, lease, poll, drain_timeout,
               max_runtime, cancel_grace, kill_grace, preload, start_method, socket_path, log_level,
               listen=None, listen_poll=10.0, stall_timeout=opts.DEFAULT_STALL_TIMEOUT, warm_models="auto",
               warm_limit_mb=opts.DEFAULT_WARM_LIMIT_MB, standby=True) -> int:
    setup_logging(log_level)
    from runner.daemon import daemon_catalogue, daemon_control, daemon_engine, daemon_options_from, serve_daemon

    options = daemon_options_from(
        name=name, capabilities=capabilities, concurrency=concurrency, devices=devices, per_device=per_device,
        heartbeat=heartbeat, lease=lease, poll=poll, drain_timeout=drain_timeout, max_runtime=max_runtime,
        cancel_grace=cancel_grace, kill_grace=kill_grace, preload=preload, start_method=start_method,
        socket_path=socket_path, listen=listen, listen_poll=listen_poll, stall_timeout=stall_timeout,
        warm_models=warm_models, warm_limit_mb=warm_limit_mb, standby=standby,
    )
    settings, url = _parent_settings()
    catalogue, capabilities = daemon_catalogue(options)
    engine, revision, code = daemon_engine(url, options, settings)
    if engine is None:
        return code
    control, code = daemon_control(options)
    if control is None:
        engine.dispose()
        return code
    return serve_daemon(options, settings, url, (engine, revision), control, catalogue, capabilities)


# --- status -----------------------------------------------------------------------------------------


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (fields: docs/operations.md, 'Runner').")
@click.option("--all", "all_runners", is_flag=True, help="Every runner of the registry (online, stale, stopped).")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None,
              help="A control socket (default: every *.sock of this session's runtime directory and of "
                   "/run/scrinalia-runner, the systemd runner's).")
@click.option("--name", default=None, help="The local runner with this --name.")
@click.option("--watch", "watch_", is_flag=True,
              help="A live view, redrawn every --interval seconds: children with progress, rate, ETA, memory and "
                   "lease, and the runner's database state; q quits.")
@click.option("--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True,
              help="Seconds between redraws of --watch.")
def status_command(as_json: bool, all_runners: bool, socket_path: Path | None, name: str | None, watch_: bool,
                   interval: float) -> None:
    """Show the local supervisor's children (over its control socket), or the registry with --all."""
    from runner import status

    if watch_:
        if as_json:
            raise click.UsageError("--watch draws a live view; it does not go with --json")
        _watch(all_runners, socket_path, name, interval)
        return
    if all_runners:
        rows = _registry_rows()
        if as_json:
            click.echo(status.dumps([status.runner_row_json(r) for r in rows]))
        else:
            click.echo(status.render_registry(rows) + "\n" + _horizon_line())
        return
    answers = _local_answers(socket_path, name)
    if as_json:
        click.echo(status.dumps(answers))
    else:
        click.echo("\n\n".join(status.render_status(a) for a in answers) + "\n" + _horizon_line())


def _horizon_line() -> str:
    """The oldest holder of the database's xmin horizon, read now (decision 0371): why the ledger grows."""
    from scrinalia.db import xmin_horizon
    from scrinalia.db.engine import one_statement
    from scrinalia.db.errors import database_errors, database_problem

    engine = _status_engine()
    try:
        with one_statement(engine) as conn:
            return "database horizon: " + xmin_horizon.describe(xmin_horizon.oldest_xmin(conn))
    except database_errors() as exc:  # one line, never a traceback
        return f"database horizon: unknown ({database_problem(exc)})"
    finally:
        engine.dispose()


def _watch(all_runners: bool, socket_path: Path | None, name: str | None, interval: float) -> None:
    from runner import control, watch

    if not all_runners:
        answers = _local_answers(socket_path, name)  # fails now, as status does, when nobody answers
        title = ", ".join(str(a.get("name")) for a in answers)
        if socket_path is not None:
            source = watch.local_source([socket_path], control.query)
        elif name is not None:
            source = watch.local_source([opts.default_socket_path(name)], control.query)
        else:  # the folders are listed anew at each redraw; a dead socket file left there is not shown
            source = watch.local_source(lambda: _sockets_in(opts.status_dirs())[0], control.query, pinned=False)
        watch.watch(source, title=f"runner {title}", interval=interval)
        return
    engine = _status_engine()
    try:
        watch.watch(watch.registry_source(engine), title="every live runner (registry)", interval=interval)
    finally:
        engine.dispose()


def _status_engine() -> Any:
    from scrinalia.db.engine import runner_engine

    settings = _settings()
    try:
        return runner_engine(settings, application_name="scrinalia-runner-status", connect_args={
            "connect_timeout": 5, "options": "-c statement_timeout=10000 -c lock_timeout=5000"})
    except Exception as exc:
        opts.exit_with(opts.EXIT_USAGE, f"configuration error: {exc}")


def _registry_rows() -> list[Any]:
    from scrinalia.db.errors import database_errors, database_problem
    from scrinalia.domains.archive import registry

    engine = _status_engine()
    try:
        return registry.list_runners(engine)
    except database_errors() as exc:  # one line, never a traceback (exit 5)
        opts.exit_with(opts.EXIT_DATABASE, database_problem(exc))
    finally:
        engine.dispose()


def _local_answers(socket_path: Path | None, name: str | None) -> list[dict[str, Any]]:
    """The status of each local runner that answers (the one named, or every socket found)."""
    from runner import control

    looked: list[str] = []
    if socket_path is not None:
        paths = [socket_path]
    elif name is not None:
        paths = [opts.default_socket_path(name)]
    else:
        paths, looked = _sockets_in(opts.status_dirs())
    answers = []
    for path in paths:
        try:
            answers.append(control.query(path, {"command": "status"}))
        except (OSError, ValueError) as exc:
            if socket_path is not None or name is not None:
                opts.exit_with(1, f"no runner answers on {path} ({exc.__class__.__name__})")
            looked.append(f"{path}: does not answer ({exc.__class__.__name__})")
    if not answers:
        opts.exit_with(1, "no runner answers; looked in " + "; ".join(looked)
              + " (use --socket PATH, or --all for the registry)")
    return answers


def _sockets_in(directories: list[Path]) -> tuple[list[Path], list[str]]:
    """The ``*.sock`` of each directory, and what was found there, said for the operator (glob alone
    would answer nothing for a directory it may not read)."""
    paths: list[Path] = []
    looked: list[str] = []
    for directory in directories:
        if not directory.is_dir():
            looked.append(f"{directory}: no such directory")
        elif not os.access(directory, os.R_OK | os.X_OK):
            looked.append(f"{directory}: permission denied (run status as the runner's user, or with sudo)")
        else:
            found = sorted(directory.glob("*.sock"))
            looked.append(f"{directory}: {len(found)} socket{'' if len(found) == 1 else 's'}")
            paths.extend(found)
    return paths, looked


# --- run (one-shot) ------------------------------------------------------------------------------------


@cli.command("run")
@click.argument("worker")
@click.option("--engine", "engine_name", default=None,
              help="The engine (default: persisted settings, then the worker's).")
@click.option("--preset", default=None)
@click.option("--batch", "db_batch_size", type=int, default=None, help="Units per database batch.")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="A worker option, read by its declared type (3 for an int, true/false for a bool, JSON for "
                   "a list or an object, the text for a string). Repeatable.")
@click.option("--engine-option", "engine_option_pairs", multiple=True, metavar="KEY=VALUE",
              help="An engine option (model=/srv/models/ner, device=cuda), read like --option. Repeatable.")
@click.option("--request", "request_json", default=None, metavar="JSON",
              help="The run request as the API takes it: {\"engine_name\": ..., \"preset\": ..., \"db_batch_size\": "
                   "..., \"options\": {...}, \"engine_options\": {...}}; '@FILE' reads it from FILE. The flags "
                   "above override its fields.")
@click.option("--by", "requested_by", default=None, help="Who asks (default: the OS user).")
@click.option("--lease", type=float, default=60.0, show_default=True)
@click.option("--heartbeat", type=float, default=15.0, show_default=True)
@click.option("--max-runtime", type=float, default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the final row as JSON.")
@click.option("--log-level", default="WARNING", show_default=True)
def run_command(worker, engine_name, preset, db_batch_size, option_pairs, engine_option_pairs, request_json,
                requested_by, lease, heartbeat, max_runtime, as_json, log_level) -> None:
    """Run WORKER once, now, in the foreground (Ctrl-C: cancel; again: kill).

    Exit: 0 SUCCESS, 1 FAILED, 2 usage, 3 the worker's slot is busy, 4 schema behind, 130 cancelled.
    """
    setup_logging(log_level)
    request = _run_request(worker, engine_name, preset, db_batch_size, option_pairs, engine_option_pairs,
                           request_json)
    settings, url = _parent_settings()
    row = _run_once(url, settings, worker, request, requested_by=requested_by, lease_seconds=lease,
                    heartbeat_seconds=heartbeat, max_runtime=max_runtime)
    _print_run(row, as_json)
    if row.status == "SUCCESS":
        sys.exit(opts.EXIT_OK)
    if row.status == "CANCELLED" or (row.status == "INTERRUPTED" and row.exit_reason == "runner-stopped"):
        sys.exit(opts.EXIT_CANCELLED)
    sys.exit(opts.EXIT_FAILED)


def _run_request(worker: str, engine_name: str | None, preset: str | None, db_batch_size: int | None,
                 option_pairs: tuple[str, ...], engine_option_pairs: tuple[str, ...] = (),
                 request_json: str | None = None) -> dict[str, Any]:
    """The run's request from the command line: ``--request`` (the API's JSON), then the flags over it,
    each ``KEY=VALUE`` read by the catalogue's declared type. Judged later by the shared validation,
    the API's, with its messages (exit 2)."""
    from runner.oneshot import request_from_json
    from scrinalia.domains.archive.workers.plugins import load_catalogue

    try:
        request = request_from_json(request_json) if request_json is not None else {}
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    flags = {"engine_name": engine_name, "preset": preset, "db_batch_size": db_batch_size}
    request.update({key: value for key, value in flags.items() if value is not None})
    spec = load_catalogue().get(worker)
    chosen = request.get("engine_name") if isinstance(request.get("engine_name"), str) else None
    for section, flag, pairs in (("options", "--option", option_pairs),
                                 ("engine_options", "--engine-option", engine_option_pairs)):
        if pairs:
            request[section] = _section_with_flags(request.get(section), spec, section, flag, pairs, chosen)
    return request


def _section_with_flags(given: Any, spec: Any, section: str, flag: str, pairs: tuple[str, ...],
                        engine_name: str | None) -> dict[str, Any]:
    """``--request``'s ``section`` (when it is an object) with each ``KEY=VALUE`` of ``flag`` over it."""
    values = dict(given) if isinstance(given, dict) else {}
    values.update(_flag_value(spec, section, flag, pair, engine_name) for pair in pairs)
    return values


def _flag_value(spec: Any, section: str, flag: str, pair: str, engine_name: str | None) -> tuple[str, Any]:
    """One ``KEY=VALUE`` of ``flag`` as the key and the JSON value a request carries (read by the type the
    catalogue declares for it in ``section``); a malformed one is a usage error, a value its type cannot
    read exits 2 with the shared validation's message."""
    from runner.oneshot import parse_option
    from scrinalia.domains.archive.errors import InvalidRunRequest
    from scrinalia.domains.archive.workers.validation import option_from_text

    try:
        key, text = parse_option(pair, flag)
        if section == "options" and key.startswith("engine_options."):
            raise click.UsageError(f"{flag} {pair!r}: an engine option takes --engine-option "
                                   f"{key.removeprefix('engine_options.')}=VALUE")
        return key, option_from_text(spec, section, key, text, engine_name)
    except InvalidRunRequest as exc:
        opts.exit_with(opts.EXIT_USAGE, str(exc))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run_once(url: Any, settings: Any, worker: str, request: dict[str, Any], **kwargs: Any) -> Any:
    """``run_once`` with a progress bar; each refusal before the run starts exits with its code."""
    from sqlalchemy.exc import SQLAlchemyError

    from runner.database import SchemaMismatch
    from runner.oneshot import ProgressBar, run_once
    from scrinalia.db.errors import database_problem
    from scrinalia.domains.archive.errors import InvalidRunRequest, WorkerRunAlreadyActive

    bar = ProgressBar()

    def started(run) -> None:
        click.echo(f"run {run.run_id} ({worker}) started; Ctrl-C cancels, twice kills", err=True)

    try:
        return run_once(url, worker, request, settings=settings, on_progress=bar.update, on_start=started,
                        handle_signals=True, **kwargs)
    except InvalidRunRequest as exc:  # UnknownWorker, UnknownOption, ... are InvalidRunRequest too
        opts.exit_with(opts.EXIT_USAGE, str(exc))
    except WorkerRunAlreadyActive as exc:
        opts.exit_with(opts.EXIT_SLOT_BUSY, str(exc))
    except SchemaMismatch as exc:  # behind: exit 4; ahead of this runner: exit 7
        opts.exit_with(exc.exit_code, str(exc))
    except OptionsError as exc:
        opts.exit_with(opts.EXIT_USAGE, str(exc))
    except SQLAlchemyError as exc:
        opts.exit_with(opts.EXIT_DATABASE, database_problem(exc))
    except KeyboardInterrupt:
        opts.exit_with(opts.EXIT_CANCELLED, "interrupted before the run started")
    finally:
        bar.close()


def _print_run(row: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(row.to_json(), indent=2, default=str))
        return
    summary = f"run {row.run_id} {row.worker_name}: {row.status}"
    if row.duration_ms is not None:
        summary += f" in {row.duration_ms / 1000:.1f}s"
    if row.exit_reason:
        summary += f" ({row.exit_reason})"
    click.echo(summary)
    if row.error:
        click.echo(row.error.splitlines()[0], err=True)
    if row.result:
        click.echo(json.dumps(row.result, default=str))


def main() -> None:
    cli(prog_name="scrinalia-runner")


if __name__ == "__main__":
    main()
