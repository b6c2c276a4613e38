"""Fixtures of the panel's browser tests: a live API (uvicorn on a free port), a real PostgreSQL (a
fresh database from the session's migrated template), a real runner daemon process, and headless
Debian chromium driven by Playwright's sync API.

Every process gets ``SCRINALIA_WORKER_PLUGINS=tests.panel.panel_workers:WORKERS``, so the API shows
the test workers and the runner can run them. Process logs go to ``test-artifacts/panel/*.log``.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from scrinalia.cli.dev import wait_http
from scrinalia.db.local_cluster import free_port
from tests.conftest import _fresh_database
from tests.panel.helpers import ADMIN, ARTIFACTS, PLUGINS, REPO, VIEWER, shot, watch_csp


def _env(database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        SCRINALIA_WORKER_PLUGINS=PLUGINS,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
        API_COOKIE_SECURE="false",
        API_LOGIN_RATE_LIMIT="1000",
    )
    env.update(extra)
    return env


class Proc:
    """A child process with its output in a log file under test-artifacts/panel/."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = ARTIFACTS / f"{name}.log"
        self.log = open(self.log_path, "ab")
        self.log.write(f"\n--- start {' '.join(argv)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


class RunnerControl:
    """Start and stop the runner daemon from inside a test (a QUEUED run needs no runner at first)."""

    def __init__(self, database_url: str, name: str = "panel-runner", capabilities: str = "panel-slow,panel-crash",
                 flags: tuple[str, ...] = ()) -> None:
        self.database_url = database_url
        self.name = name
        self.capabilities = capabilities
        self.flags = flags
        self.proc: Proc | None = None
        self.socket_dir = Path(tempfile.mkdtemp(prefix="scrinalia-panel-runner-"))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def start(self) -> RunnerControl:
        if self.running:
            return self
        argv = [
            sys.executable, "-m", "runner.cli", "daemon",
            "--name", self.name, "--capabilities", self.capabilities,
            "--concurrency", "2", "--heartbeat", "1", "--lease", "6", "--poll", "0.5", "--drain-timeout", "5",
            # The panel's workers import no torch: a fork server that preloads it only makes each start
            # (and the loop's first heartbeat, which the tests wait for) ~10 s of CPU later.
            "--preload", "none",
            # A socket of its own, in a directory of its own (the runner makes its socket's directory 0700):
            # another test session on this host may run a "panel-runner" too.
            "--socket", str(self.socket_dir / f"{self.name}.sock"),
            *self.flags,
        ]
        self.proc = Proc("runner", argv, _env(self.database_url))
        return self

    def wait_registered(self, engine: Engine, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.running, f"the runner exited:\n{self.proc.tail() if self.proc else ''}"
            with engine.connect() as conn:
                n = conn.execute(text(
                    "SELECT count(*) FROM archive_worker_runners WHERE name = :n AND stopped_at IS NULL"
                ), {"n": self.name}).scalar_one()
            if n:
                return
            time.sleep(0.2)
        raise AssertionError(f"the runner did not register within {timeout} s:\n{self.proc.tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(30)
            self.proc = None

    def remove_socket_dir(self) -> None:
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def panel_database_url(pg_admin_url: str, admin_engine: Engine, template_database: str) -> Iterator[str]:
    """One database for a test module (its processes outlive a single test)."""
    yield from _fresh_database(pg_admin_url, admin_engine, template_database)


@pytest.fixture(scope="module")
def panel_engine(panel_database_url: str) -> Iterator[Engine]:
    from scrinalia.db.engine import create_engine_from_url

    engine = create_engine_from_url(panel_database_url, pool_size=2, max_overflow=4)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def panel_users(panel_engine: Engine) -> dict[str, tuple[str, str]]:
    from scrinalia.domains.identity import users

    users.create_user(panel_engine, ADMIN[0], ADMIN[1], "ADMIN")
    users.create_user(panel_engine, VIEWER[0], VIEWER[1], "VIEWER")
    return {"admin": ADMIN, "viewer": VIEWER}


@pytest.fixture(scope="module")
def live_api(panel_database_url: str, panel_users) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-proxy-headers"]
    proc = Proc("api", argv, _env(panel_database_url))
    base = f"http://127.0.0.1:{port}"
    if not wait_http(f"{base}/healthz", 60, alive=proc.alive):
        what = "did not answer within 60 s" if proc.alive() else "exited"
        proc.stop()
        raise AssertionError(f"the API {what}:\n{proc.tail()}")
    yield base
    proc.stop()


@pytest.fixture(scope="module")
def runner_control(panel_database_url: str) -> Iterator[RunnerControl]:
    control = RunnerControl(panel_database_url)
    yield control
    control.stop()
    control.remove_socket_dir()


@pytest.fixture
def page(browser, live_api: str, request):
    context = browser.new_context(base_url=live_api, viewport={"width": 1280, "height": 900},
                                  color_scheme="light", reduced_motion="reduce")
    violations = watch_csp(context)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        shot(pg, f"FAILED-{request.node.name}")
    context.close()
    assert not errors, f"JavaScript errors in the panel: {errors}"
    # Every panel test walks its pages under the Content-Security-Policy: nothing may be refused.
    assert not violations, f"Content-Security-Policy violations in the panel: {violations}"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
