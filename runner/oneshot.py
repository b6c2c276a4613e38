"""The one-shot runner: ``scrinalia-runner run WORKER`` and its programmatic form ``run_once``.

It is a runner of its own (registry kind "cli": its own runner id, lease and heartbeat), it creates the
run already RUNNING with trigger CLI (``ledger.create_running``), and it runs the same child entry point
as the daemon, in the foreground, through the same supervisor on its own phase list
(``loop_state.ONESHOT``: no claims). A crash of this process leaves a RUNNING row whose lease expires;
the next runner or CLI repairs it.
"""
from __future__ import annotations

import getpass
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.database import check_schema, child_connect_args, parent_engine, registration
from runner.launchers import SpawnLauncher
from runner.loop_state import ONESHOT, ChildSetup, Services
from runner.options import RunnerOptions
from runner.ports import Host
from runner.supervisor import Supervisor
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.domains.archive.workers.sdk import ResolvedConfig
from scrinalia.domains.archive.workers.validation import validated_run
from scrinalia.settings import DatabaseUrl, Settings

log = logging.getLogger("scrinalia.runner.oneshot")


def run_once(
    database_url: str,
    worker_name: str,
    request: Mapping[str, Any],
    *,
    requested_by: str | None = None,
    lease_seconds: float = 60.0,
    heartbeat_seconds: float = 15.0,
    settings: Settings | None = None,
    max_runtime: float | None = None,
    cancel_grace: float = 60.0,
    preload: tuple[str, ...] = (),
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[WorkerRun], None] | None = None,
    handle_signals: bool = False,
) -> WorkerRun:
    """Run ``worker_name`` once, now, in a child process; block; return the run's final row.

    Raises ``SchemaBehind`` or ``SchemaAhead`` (the schema is not this runner's head), ``InvalidRunRequest``
    (``UnknownWorker``, ``UnknownOption``, ``InvalidOption``, ``MissingOption``...: the shared validation) and
    ``WorkerRunAlreadyActive`` (the worker's slot is taken) before anything runs. Every other outcome is
    in the returned row (SUCCESS, FAILED, CANCELLED, INTERRUPTED).
    ``handle_signals`` (the CLI; main thread only): Ctrl-C cancels, a second Ctrl-C kills.
    """
    options = RunnerOptions(
        name=f"cli:{requested_by or _user()}", capabilities=(worker_name,), concurrency=1,
        heartbeat_seconds=heartbeat_seconds, lease_seconds=lease_seconds, max_runtime=max_runtime,
        cancel_grace=cancel_grace, start_method="spawn", preload=preload,
    ).validate()
    url = database_url if isinstance(database_url, DatabaseUrl) else DatabaseUrl(database_url)
    engine = parent_engine(url, options, settings)
    try:
        revision = check_schema(engine)
        # The shared validation (the API's, the scheduler's): a refused request writes nothing. Its
        # resolution is the run's: the run starts now, so it is not resolved again (decision 0135).
        catalogue = load_catalogue()
        validated = validated_run(catalogue, engine, worker_name, request)
        sup = Supervisor(
            options, registration(options, [worker_name], kind="cli", schema_revision=revision),
            SpawnLauncher(preload=preload),
            ChildSetup(url.render(), child_connect_args(settings, options), catalogue, engine),
            services=Services(on_progress=(lambda child: on_progress(dict(child.progress or {})))
                              if on_progress else None),
            host=Host(install_signals=handle_signals), loop=ONESHOT,
        )
        run = {"worker_name": worker_name, "request": validated.request, "lease_seconds": lease_seconds,
               "requested_by": requested_by or _user()}
        return _run_in(sup, run, validated.resolved, on_start)
    finally:
        engine.dispose()


def _run_in(sup: Supervisor, what: dict[str, Any], resolved: ResolvedConfig,
            on_start: Callable[[WorkerRun], None] | None) -> WorkerRun:
    """Create the RUNNING row under ``sup``'s runner id, run it through ``sup``'s loop with its
    resolution (``resolved``), return its final row."""
    port = sup.db.ledger
    sup.open()
    try:
        # Through the ledger link (decision 0351): counted, bounded by the fence point; a failure propagates.
        run = sup.db.send(
            "create_running", port.create_running, what["worker_name"], what["request"], runner_id=sup.runner_id,
            lease_seconds=what["lease_seconds"], requested_by=what["requested_by"],
        )
        if on_start is not None:
            on_start(run)
        sup.adopt(run, resolved)
        sup.serve()
        final = sup.finished.get(run.run_id)
        if final is None:
            final = sup.db.send("get_run", port.get_run, run.run_id)
        assert final is not None
        return final
    finally:
        sup.close()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


# --- option parsing and the progress bar (the CLI's side) -------------------------------------------


def parse_option(text: str, flag: str = "--option") -> tuple[str, str]:
    """``k=v`` -> (k, v): the text as typed; the catalogue's declared type reads it
    (``validation.option_from_text``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"{flag} {text!r} must look like key=value")
    return key, raw


def request_from_json(text: str) -> dict[str, Any]:
    """``--request``: the API's JSON run request (``@FILE`` reads it from FILE), through the bounded
    reader; an object, or ``ValueError`` saying why not."""
    from scrinalia import bounded_json

    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--request {text}: {exc.strerror or exc}") from None
    try:
        value = bounded_json.loads(text)
    except bounded_json.JsonRefused as exc:
        raise ValueError(f"--request {exc.message}") from None
    if not isinstance(value, dict):
        raise ValueError("--request must be a JSON object (the API's run request)")
    return value


class ProgressBar:
    """A one-line progress bar on a terminal (stderr); nothing when stderr is not a TTY."""

    def __init__(self, stream=None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.width = width
        self.started = time.monotonic()
        self._drawn = False

    def update(self, progress: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        done, total = progress.get("done") or 0, progress.get("total")
        unit = progress.get("unit") or "units"
        rate = done / max(time.monotonic() - self.started, 1e-9)
        if isinstance(total, int) and total > 0:
            filled = int(self.width * min(done, total) / total)
            bar = "#" * filled + "-" * (self.width - filled)
            text = f"[{bar}] {done}/{total} {unit} {100 * done / total:5.1f}%  {rate:.1f}/s"
        else:
            text = f"{done} {unit}  {rate:.1f}/s"
        self.stream.write("\r" + text + "\033[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
