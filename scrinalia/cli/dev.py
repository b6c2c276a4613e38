"""``scrinalia dev``: the whole system on one machine, with one command (``make dev``).

What it does, in order (the README's first screen says the same):

1. the database: ``DATABASE_URL`` when it is set; otherwise a private PostgreSQL under ``.scrinalia/``
   made with the installed PostgreSQL binaries (``initdb``/``pg_ctl``), or with the ``pgserver`` wheel
   when no binaries are installed. A second run finds the same cluster and reuses its data;
2. migrates it to the bundled head (alembic);
3. loads the demo collection (about 200 archival descriptions; loading twice adds nothing);
4. creates an ADMIN, once: its password is ``SCRINALIA_ADMIN_PASSWORD`` or a random one printed once,
   and it must be changed at the first login. A second run never creates a second admin;
5. starts the API (which serves the panel from ``ui/``) and a runner daemon with every worker of the
   catalogue as its capabilities, and prefixes each process's log lines (``api    | ``, ``runner | ``);
6. prints the URL, what to do first, an ``export DATABASE_URL=...`` line for the other CLIs, and which
   workers need a setting before they can run (``ner`` needs a model directory); Ctrl-C (or SIGTERM)
   drains the runner (a short dev drain: 5 s), stops the API and then the private PostgreSQL, in that
   order; a second Ctrl-C stops now (the runner interrupts its runs at once). A PostgreSQL that was
   already running (another ``scrinalia dev`` started it) is reused and left running, and it says so.
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from scrinalia.domains.archive.run_ids import short_id

DEFAULT_ADMIN_EMAIL = "admin@scrinalia.local"
DATABASE_NAME = "scrinalia"
#: The dev runner's --drain-timeout: a developer's Ctrl-C should not wait a production drain.
DEV_DRAIN_S = 5.0
_COLOURS = {"api": "\033[36m", "runner": "\033[35m", "sched": "\033[32m", "dev": "\033[33m"}
_RESET = "\033[0m"


class DevError(click.ClickException):
    """A step of ``scrinalia dev`` failed; the message says which and what to do."""


# --- output -----------------------------------------------------------------------------------------

_print_lock = threading.Lock()


def _prefix(name: str) -> str:
    label = f"{name:<6} | "
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return f"{_COLOURS.get(name, '')}{label}{_RESET}"
    return label


def say(line: str, name: str = "dev") -> None:
    with _print_lock:
        sys.stdout.write(_prefix(name) + line + "\n")
        sys.stdout.flush()


# --- the database --------------------------------------------------------------------------------------


@dataclass
class Database:
    """Where the data lives, and how to stop it again (when we started it)."""

    url: str
    description: str
    stop: Callable[[], None] = field(default=lambda: None)
    #: Set when this run reused a PostgreSQL someone else started: it is left running, and this says how
    #: to stop it.
    left_running: str | None = None


def _redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _ensure_database(admin_url: str, name: str) -> str:
    """CREATE DATABASE ``name`` on the server of ``admin_url`` unless it exists; return its URL."""
    from scrinalia.db.engine import create_engine_from_url

    engine = create_engine_from_url(admin_url, isolation_level="AUTOCOMMIT", application_name="scrinalia-dev")
    try:
        with engine.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
            if exists is None:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def start_embedded_database(data_dir: Path) -> Database:
    """A private PostgreSQL under ``data_dir``: the installed binaries, else the ``pgserver`` wheel."""
    from scrinalia.db.local_cluster import LocalCluster, LocalClusterError, find_bindir, free_port

    try:
        find_bindir()
    except LocalClusterError:
        return _start_pgserver(data_dir)
    fresh = not (data_dir / "pgdata" / "PG_VERSION").exists()
    cluster = LocalCluster.create(data_dir)
    left_running = None
    if cluster.is_running():
        # Another `scrinalia dev` started it: reuse it and leave it running for that one.
        say(f"PostgreSQL under {data_dir} is already running; reusing it (it is left running at the end)")
        stop = lambda: None  # noqa: E731 - the other branch binds cluster.stop: one name, two callables
        left_running = (f"PostgreSQL under {cluster.data_dir} was already running when this started: left running "
                        f"(stop it with the `make dev` that started it, or: pg_ctl -D {cluster.data_dir} stop)")
    else:
        if not port_is_free("127.0.0.1", cluster.port):
            # The port saved at the last run has been taken by something else since.
            cluster = LocalCluster.create(data_dir, port=free_port())
        try:
            cluster.start()
        except LocalClusterError as exc:
            raise DevError(f"the private PostgreSQL did not start: {exc} (log: {data_dir / 'postgres.log'})") from None

        def stop() -> None:
            cluster.stop("fast")
            if (cluster.data_dir / "postmaster.pid").exists():
                raise DevError(f"PostgreSQL under {cluster.data_dir} may still be running: its pg_ctl could not stop "
                               f"it (is the directory still readable by the postgres user?)")
    url = _ensure_database(cluster.url("postgres"), DATABASE_NAME)
    what = "new" if fresh else "existing"
    return Database(url, f"private PostgreSQL ({what} data in {data_dir / 'pgdata'}, port {cluster.port})", stop,
                    left_running)


def _start_pgserver(data_dir: Path) -> Database:
    try:
        import pgserver  # type: ignore[import-not-found]  # optional: only when no PostgreSQL is installed
    except ImportError:
        raise DevError(
            "no PostgreSQL server binaries are installed (initdb, pg_ctl) and the pgserver wheel is absent: "
            "install one of them (`apt-get install postgresql` or `.venv/bin/pip install pgserver`), "
            "or set DATABASE_URL to an existing server"
        ) from None
    pgdata = data_dir / "pgserver"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(pgdata), cleanup_mode="stop")
    url = _ensure_database(server.get_uri("postgres"), DATABASE_NAME)
    return Database(url, f"private PostgreSQL from the pgserver wheel (data in {pgdata})", server.cleanup)


# --- the steps before the processes ------------------------------------------------------------------


def load_demo(engine: Engine) -> str:
    """Load the demo collection (a second load adds nothing); say what happened."""
    from scrinalia.domains.archive.demo import load_demo_collection

    added = load_demo_collection(engine)
    return f"demo collection: {added} new documents" if added else "demo collection already loaded"


@dataclass
class AdminOutcome:
    email: str
    password: str | None  # set only when the admin was created now
    created: bool


def ensure_admin(engine: Engine, email: str, password: str | None) -> AdminOutcome:
    """Create the first ADMIN unless an active one exists. It must change its password at first login."""
    with engine.connect() as conn:
        existing = conn.execute(
            text("SELECT email FROM auth_users WHERE role = 'ADMIN' AND is_active ORDER BY id LIMIT 1")
        ).scalar()
    if existing is not None:
        return AdminOutcome(existing, None, False)
    password = password or secrets.token_urlsafe(12)
    _create_user(engine, email, password)
    return AdminOutcome(email, password, True)


def _create_user(engine: Engine, email: str, password: str) -> None:
    from scrinalia.domains.identity import users
    from scrinalia.domains.identity.errors import InvalidUserInput

    try:
        users.create_user(engine, email=email, password=password, role="ADMIN", must_change_password=True)
    except InvalidUserInput as exc:
        raise DevError(f"cannot create the admin: {exc} (SCRINALIA_ADMIN_EMAIL / SCRINALIA_ADMIN_PASSWORD)") from None


# --- the processes ------------------------------------------------------------------------------------


class Managed:
    """A child process whose output is read line by line and printed with a prefix."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Its own process group: Ctrl-C reaches only us, and we stop the children in order.
            start_new_session=True,
            bufsize=1,
            text=True,
            errors="replace",
        )
        self.reader = threading.Thread(target=self._pump, name=f"dev-{name}-log", daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            say(short_run_ids(line.rstrip("\n")), self.name)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def send(self, signum: int) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float, signum: int = signal.SIGTERM) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL the process group."""
        self.send(signum)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            say(f"{self.name} did not stop within {timeout:.0f} s: killing it")
            self.send(signal.SIGKILL)
            code = self.proc.wait(10)
        self.reader.join(2)
        return code


#: A UUID as the processes log it, in either case (a run's; a runner's is shortened alike).
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")


def short_run_ids(line: str) -> str:
    """One form of run id in the relayed log: the short one the panel and ``status`` show (its last 12
    hex digits, ``run_ids.short_id``), which every command that takes a run id accepts. The processes
    log whole ids (their journals keep them); only this developer's view is shortened."""
    return _UUID.sub(lambda m: short_id(m.group(0)), line)


def child_env(database_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("API_COOKIE_SECURE", "false")  # plain http on localhost: the cookie cannot be Secure
    # No "Loading weights" progress bars from the runner's children: tqdm's redraws are noise in a
    # relayed log (transformers reads this at import; an operator may set it to 0 to see them).
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if extra:
        env.update(extra)
    return env


def api_argv(host: str, port: int) -> list[str]:
    # uvicorn itself rather than `scrinalia api`, for --no-access-log: the panel polls every 5 s.
    return [
        sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
        "--host", host, "--port", str(port), "--no-access-log", "--log-level", "info", "--no-server-header",
        "--no-proxy-headers",  # forwarded headers: API_TRUSTED_PROXIES only (scrinalia.api.middleware)
    ]


def scheduler_argv() -> list[str]:
    return [sys.executable, "-m", "scrinalia.cli.main", "scheduler", "run"]


def runner_argv(name: str, concurrency: int, capabilities: list[str] | None = None,
                extra: list[str] | None = None) -> list[str]:
    argv = [
        sys.executable, "-m", "runner.cli", "daemon",  # `scrinalia-runner daemon`: the one way to start one
        "--name", name, "--concurrency", str(concurrency),
    ]
    if capabilities:
        argv += ["--capabilities", ",".join(capabilities)]
    return argv + list(extra or [])


def wait_http(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status < 500:
                    return True
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _catalogue_names() -> list[str]:
    try:
        from scrinalia.domains.archive.workers.plugins import load_catalogue

        return list(load_catalogue())
    except Exception as exc:  # a broken plugin must not stop the API from starting
        say(f"could not read the worker catalogue ({exc}); the runner will use its default")
        return []


def export_line(database: Database, external: bool) -> str:
    """The line that gives the other CLIs (``scrinalia users``, ``scrinalia scheduler``, ``scrinalia-runner``)
    this database. The private cluster's URL holds no secret (trust authentication on 127.0.0.1 only,
    decision 0085), so it is printed whole; a URL with a password never is: its password is masked."""
    if external:
        return "  other CLIs: they read the DATABASE_URL you set for this shell"
    parsed = make_url(database.url)
    if parsed.password:
        return (f"  export DATABASE_URL={parsed.render_as_string(hide_password=True)}"
                "   (its password is not printed; put it in place of ***)")
    return f"  export DATABASE_URL={database.url}"


def needs_setup(database_url: str) -> dict[str, str]:
    """The workers a default run would be refused for (the shared validation over the persisted
    settings: ``ner`` without a model directory), with the reason; a broken catalogue is reported."""
    from scrinalia.db.engine import create_engine_from_url
    from scrinalia.domains.archive.errors import InvalidRunRequest
    from scrinalia.domains.archive.workers.plugins import load_catalogue
    from scrinalia.domains.archive.workers.validation import validate_run_request

    engine = create_engine_from_url(database_url, application_name="scrinalia-dev")
    out: dict[str, str] = {}
    try:
        catalogue = load_catalogue()
        for name in catalogue:
            try:
                validate_run_request(catalogue, engine, name, {})
            except InvalidRunRequest as exc:
                out[name] = exc.field
    except Exception as exc:  # the banner must not stop make dev
        say(f"could not check the workers' settings ({exc})")
    finally:
        engine.dispose()
    return out


def _banner(url: str, admin: AdminOutcome, database: Database, workers: list[str], *, external: bool = False,
            setup: dict[str, str] | None = None) -> list[str]:
    lines = [
        "",
        "=" * 72,
        f"  Scrinalia is running:  {url}",
        f"  database:  {database.description}",
        export_line(database, external),
        f"  workers:   {', '.join(workers) if workers else '(see the panel)'}",
    ]
    for name, what in (setup or {}).items():
        lines.append(f"  {name} needs a model: set {what} in the panel (Workers > {name} > Settings); "
                     "docs/workers.md, \"Models\"")
    lines.append("")
    if admin.created:
        lines += [
            f"  admin:     {admin.email}",
            f"  password:  {admin.password}",
            "             (shown this once; you must change it at the first login)",
        ]
    else:
        lines += [
            f"  admin:     {admin.email} (already created on a previous run; its password is not shown again;",
            "             `scrinalia users reset-password EMAIL`, after the export above, sets a new one)",
        ]
    lines += [
        "",
        "  What to do first:",
        f"    1. open {url} and log in as {admin.email};",
        "    2. choose your own password when the panel asks;",
        "    3. on the Workers page, press Run on `embedding`: the idle runner claims it within a fraction of",
        "       a second (so QUEUED is seldom seen), its card shows RUNNING with a progress bar over the demo's",
        "       documents, then its last run SUCCESS; the Runs page lists the run.",
        "",
        "  Ctrl-C stops everything (a second Ctrl-C stops now); `make dev` again reuses the data",
        "  (rm -rf .scrinalia to start over).",
        "=" * 72,
        "",
    ]
    return lines


# --- the command ---------------------------------------------------------------------------------------


@click.command("dev")
@click.option("--port", type=int, default=8000, show_default=True, envvar="SCRINALIA_DEV_PORT",
              help="Port of the API and the panel (0 picks a free one).")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="SCRINALIA_DEV_HOST",
              help="Address the API listens on.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".scrinalia"),
              show_default=True, envvar="SCRINALIA_DEV_DIR",
              help="Where the private PostgreSQL keeps its data (unused when DATABASE_URL is set).")
@click.option("--admin-email", default=DEFAULT_ADMIN_EMAIL, show_default=True, envvar="SCRINALIA_ADMIN_EMAIL",
              help="E-mail of the admin created at the first run.")
@click.option("--concurrency", type=int, default=2, show_default=True, help="The runner's --concurrency.")
@click.option("--runner/--no-runner", default=True, show_default=True, help="Start a runner daemon.")
@click.option("--scheduler/--no-scheduler", default=True, show_default=True, help="Start the scheduler.")
@click.option("--demo/--no-demo", default=True, show_default=True, help="Load the demo collection.")
def command(port: int, host: str, data_dir: Path, admin_email: str, concurrency: int, runner: bool,
            scheduler: bool, demo: bool) -> None:
    """Run everything locally: PostgreSQL, migrations, demo data, an admin, the API with the panel, a runner.

    With DATABASE_URL set, that database is used and no private PostgreSQL is started.
    """
    if port == 0:
        from scrinalia.db.local_cluster import free_port

        port = free_port()
    if not port_is_free(host, port):
        raise DevError(f"port {port} on {host} is taken: stop what uses it, or run `scrinalia dev --port N` "
                       f"(make dev SCRINALIA_DEV_PORT=N)")

    stopping = threading.Event()
    processes: list[Managed] = []

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            # The second one: stop now. A second SIGTERM makes the runner interrupt its runs at once
            # (its own rule), and the others are already being stopped.
            say(f"{signal.Signals(signum).name} again: stopping now")
            for proc in processes:
                proc.send(signal.SIGTERM)
            return
        stopping.set()
        say(f"{signal.Signals(signum).name}: stopping everything (runner drains first, {DEV_DRAIN_S:.0f} s; "
            "Ctrl-C again stops now)")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    external = os.environ.get("DATABASE_URL")
    if external:
        database = Database(external, f"DATABASE_URL ({_redacted(external)})")
    else:
        say(f"starting a private PostgreSQL under {data_dir}/")
        database = start_embedded_database(data_dir)
    try:
        _prepare_and_run(database, host, port, admin_email, concurrency, runner, scheduler, demo, stopping,
                         processes, external=bool(external))
    finally:
        _stop_processes(processes)
        stopped = _stop_database(database, external=bool(external))
        say("all stopped" if stopped else "stopped, except PostgreSQL (see above)")


def _stop_processes(processes: list[Managed]) -> None:
    for proc in reversed(processes):  # the runner first (it drains), then the API
        if proc.poll() is None:
            say(f"stopping {proc.name} (pid {proc.pid})")
        code = proc.stop(timeout=DEV_DRAIN_S + 15 if proc.name == "runner" else 15)
        clean = code in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        say(f"{proc.name} stopped" + ("" if clean else f" (exit {code})"))


def _stop_database(database: Database, *, external: bool) -> bool:
    """Stop the private PostgreSQL this command started; False when it is left running."""
    if database.left_running:
        say(database.left_running)
        return False
    if external:
        return True
    say("stopping PostgreSQL")
    try:
        database.stop()
    except Exception as exc:  # report it, the rest is stopped already
        say(f"PostgreSQL did not stop cleanly: {exc}")
        return False
    return True


def _prepare_and_run(database: Database, host: str, port: int, admin_email: str, concurrency: int,
                     runner: bool, scheduler: bool, demo: bool, stopping: threading.Event,
                     processes: list[Managed], *, external: bool = False) -> None:
    admin = _prepare_database(database, admin_email, demo)
    if stopping.is_set():
        return

    env = child_env(database.url)
    env.pop("SCRINALIA_ADMIN_PASSWORD", None)
    processes.append(Managed("api", api_argv(host, port), env))
    url = f"http://{'localhost' if host in ('127.0.0.1', '0.0.0.0') else host}:{port}/"
    if not wait_http(f"http://{host if host != '0.0.0.0' else '127.0.0.1'}:{port}/healthz", 60,
                     alive=lambda: processes[0].poll() is None and not stopping.is_set()):
        if stopping.is_set():
            return
        raise DevError("the API did not answer on /healthz within 60 s (its log is above)")
    workers = _catalogue_names()
    if runner:
        name = f"dev-{socket.gethostname()}"
        # The progress reaches the ledger with each heartbeat: 5 s matches the panel's 5 s poll.
        timings = ["--heartbeat", "5", "--lease", "30", "--poll", "1", "--drain-timeout", str(DEV_DRAIN_S)]
        processes.append(Managed("runner", runner_argv(name, concurrency, extra=timings), env))
    if scheduler:
        processes.append(Managed("sched", scheduler_argv(), env))
    for line in _banner(url, admin, database, workers, external=external, setup=needs_setup(database.url)):
        say(line)
    admin.password = None  # printed once

    _watch(processes, stopping)


def _prepare_database(database: Database, admin_email: str, demo: bool) -> AdminOutcome:
    """Migrate to the bundled head, load the demo collection, make sure the admin exists."""
    from scrinalia.db import migrate
    from scrinalia.db.engine import create_engine_from_url

    say("migrating the schema to the bundled head")
    migrate.upgrade(database.url)
    engine = create_engine_from_url(database.url, application_name="scrinalia-dev")
    try:
        if demo:
            say(load_demo(engine))
        admin = ensure_admin(engine, admin_email, os.environ.get("SCRINALIA_ADMIN_PASSWORD") or None)
        say(f"admin {admin.email}: {'created' if admin.created else 'exists already'}")
    finally:
        engine.dispose()
    return admin


def _watch(processes: list[Managed], stopping: threading.Event) -> None:
    """Until asked to stop: one process that exits stops the rest."""
    while not stopping.wait(0.5):
        for proc in processes:
            code = proc.poll()
            if code is not None:
                stopping.set()
                say(f"{proc.name} exited unexpectedly (exit {code}); stopping the rest")
                raise SystemExit(1)
