"""The previous release on the head schema (issue 18, expand/contract, decision 0125).

The deploy order is migrate -> API -> scheduler -> runner, so between ``scrinalia db upgrade`` and their
replacement the previous release's processes keep serving on the new schema. Here they are the real
thing: the release of ``PREVIOUS_RELEASE`` (tests/foundation/previous_release.py: its tree and its own
virtual environment, cached outside the repository), its database made by its own ``scrinalia db
upgrade``, its API, scheduler and runner daemon (as its least-privilege role) as processes, started
before the upgrade as they would be in production, a run in flight during it. After this checkout's
``scrinalia db upgrade`` and ``scrinalia db runner-role`` (step 1 of the deploy): that run ends SUCCESS;
the old API logs in and reads; the old runner claims
the runs the old API enqueues and its children run them to SUCCESS (one of them writes the archive);
the old scheduler fires a schedule; the account the old release locked before the upgrade and the one
it locks after it stay locked, for the old API and for this release's API alike. And this release's
runner refuses the previous schema with the right words, and its ``scrinalia db downgrade`` returns the
database to one the previous release accepts (the rollback).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.local_cluster import free_port
from scrinalia.domains.identity.passwords import hash_password
from tests.api.live import live_api
from tests.foundation.previous_release import PreviousRelease, previous_release

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"
WRONG = "not the password at all"
THRESHOLD = 3  # the lockout threshold of both APIs here (API_LOCKOUT_THRESHOLD)

# The first build of the previous release's environment (once per machine) takes minutes.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def release() -> PreviousRelease:
    built = previous_release()
    if built.build_seconds:
        print(f"\nbuilt the previous release's environment in {built.build_seconds:.0f} s")
    return built


class Process:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log_path = proc, log

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def process(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[Process]:
    """A real process with its output in a file; SIGTERM at the end (SIGKILL if it lingers)."""
    log = Path(tempfile.mkdtemp(prefix="scrinalia-prev-")) / "out.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        yield Process(proc, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_until(predicate, timeout: float, what: str, alive: Process | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and alive.proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited {alive.proc.returncode}:\n{alive.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                                 + (f":\n{alive.log()[-3000:]}" if alive else ""))
        time.sleep(0.1)


def answers(base: str) -> bool:
    try:
        httpx.get(f"{base}/healthz", timeout=2)
        return True
    except httpx.HTTPError:
        return False


def login(base: str, email: str, password: str) -> httpx.Response:
    return httpx.post(f"{base}/api/v1/auth/login", json={"email": email, "password": password, "issue_token": True},
                      timeout=30)


def bearer(base: str, email: str) -> dict[str, str]:
    r = login(base, email, PASSWORD)
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def lock_out(base: str, email: str) -> None:
    """``THRESHOLD`` wrong passwords: the last answer is the lock (423)."""
    answers_ = [login(base, email, WRONG).status_code for _ in range(THRESHOLD)]
    assert answers_[:-1] == [401] * (THRESHOLD - 1) and answers_[-1] == 423, answers_


def old_cli(release: PreviousRelease, url: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([release.python, "-m", "scrinalia.cli.main", *args], cwd=release.src,
                          env=release.env(url), input=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def head_cli(url: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "RUNNER_", "DB_", "PG"))}
    env.update(DATABASE_URL=url, PYTHONPATH=str(ROOT), SCRINALIA_WORKER_PLUGINS="tests.runner.workers:ALL", **extra)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


ROLE_PASSWORD = "runner-secret"
USERS = (("admin@example.org", "ADMIN"), ("early@example.org", "VIEWER"), ("late@example.org", "VIEWER"))


def previous_schema(release: PreviousRelease, url: str, runner_role: str) -> str:
    """The database as that release's own ``scrinalia db upgrade`` leaves it, with its runner's
    least-privilege role (its ``scrinalia db runner-role``) and three users; the role's URL. The users are
    inserted directly (one argon2 hash for all, as its ``users create`` would store it): each command of
    the release costs seconds of imports."""
    old_cli(release, url, "db", "upgrade")
    done = subprocess.run([release.python, "-m", "scrinalia.cli.main", "db", "runner-role", "--role", runner_role],
                          cwd=release.src, env=release.env(url, RUNNER_DB_PASSWORD=ROLE_PASSWORD),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    digest = hash_password(PASSWORD)
    engine = create_engine_from_url(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO auth_users (email, password_hash, role) "
                              "VALUES (:e, :h, CAST(:r AS user_role))"),
                         [{"e": email, "h": digest, "r": role} for email, role in USERS])
    finally:
        engine.dispose()
    return make_url(url).set(username=runner_role, password=ROLE_PASSWORD).render_as_string(hide_password=False)


def revision(url: str) -> str | None:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return migrate.current_revision(conn)
    finally:
        engine.dispose()


def registered_runner(url: str, name: str) -> str | None:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT runner_id::text FROM archive_worker_runners "
                                      "WHERE name = :n AND stopped_at IS NULL"), {"n": name}).scalar()
            return str(found) if found else None
    finally:
        engine.dispose()


def finished(base: str, headers: dict[str, str], run_id: str) -> dict | None:
    got = httpx.get(f"{base}/api/v1/system/runs/{run_id}", headers=headers, timeout=30)
    assert got.status_code == 200, got.text
    run = got.json()
    return run if run["status"] not in ("QUEUED", "RUNNING") else None


def run_status(url: str, run_id: str) -> str | None:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT status::text FROM archive_worker_runs WHERE run_id = :r"),
                                {"r": run_id}).scalar()
    finally:
        engine.dispose()


def seed_archive(url: str) -> None:
    """Three documents and one REWRITE rule for the cleaning worker."""
    engine = create_engine_from_url(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO archive_documents (reference_code, title) "
                              "SELECT 'REF-' || i, 'Draft letter ' || i FROM generate_series(1, 3) AS i"))
            conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                              "VALUES ('no drafts', 'REWRITE', 'title', '^Draft ', '')"))
    finally:
        engine.dispose()


def titles(url: str) -> list[str]:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text("SELECT title FROM archive_documents ORDER BY id")).scalars())
    finally:
        engine.dispose()


def scheduled_run(url: str, worker: str) -> tuple[str, str] | None:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT status::text, runner_id::text FROM archive_worker_runs WHERE worker_name = :w "
                "AND trigger = 'SCHEDULE' AND status NOT IN ('QUEUED', 'RUNNING')"), {"w": worker}).first()
            return (row[0], row[1]) if row else None
    finally:
        engine.dispose()


def runner_sessions(url: str) -> set[str]:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(text(
                "SELECT usename FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'scrinalia-runner'")).scalars())
    finally:
        engine.dispose()


@pytest.fixture
def runner_role(empty_database_url) -> Iterator[str]:
    """A role name for the previous runner, dropped after the test (roles outlive databases)."""
    role = f"prev_runner_{uuid.uuid4().hex[:8]}"
    yield role
    engine = create_engine_from_url(empty_database_url)
    try:
        with engine.begin() as conn:
            if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar():
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))
    finally:
        engine.dispose()


def test_the_previous_release_serves_on_the_head_schema_and_its_lockouts_hold(release, empty_database_url,
                                                                              runner_role, tmp_path):
    url = empty_database_url
    role_url = previous_schema(release, url, runner_role)
    seed_archive(url)
    assert revision(url) == release.schema_head
    port = free_port()
    old_base = f"http://127.0.0.1:{port}"
    api_env = release.env(url, API_COOKIE_SECURE="false", API_LOGIN_RATE_LIMIT="1000",
                          API_LOCKOUT_THRESHOLD=str(THRESHOLD))
    runner_argv = [release.python, "-m", "runner.cli", "daemon", "--name", "previous-release", "--preload", "none",
                   "--start-method", "spawn", "--poll", "0.5", "--heartbeat", "1", "--lease", "30",
                   "--socket", str(tmp_path / "previous.sock")]
    with process([release.python, "-m", "scrinalia.cli.main", "api", "--port", str(port), "--log-level", "warning"],
                 api_env, release.src) as old_api, \
         process(runner_argv, release.env(url, RUNNER_DATABASE_URL=role_url), release.src) as old_runner, \
         process([release.python, "-m", "scrinalia.cli.main", "scheduler", "run", "--interval", "0.5"],
                 release.env(url), release.src) as old_scheduler:
        wait_until(lambda: answers(old_base), 90, "the previous release's API", old_api)
        old_runner_id = wait_until(lambda: registered_runner(url, "previous-release"), 90,
                                   "the previous release's runner to register", old_runner)
        assert runner_sessions(url) == {runner_role}, "the previous runner connects as its own role"
        lock_out(old_base, "early@example.org")  # locked by the previous release, before the upgrade
        admin = bearer(old_base, "admin@example.org")
        # A run in flight while the schema changes under it.
        r = httpx.post(f"{old_base}/api/v1/system/workers/slow/runs",
                       json={"options": {"units": 10, "pause": 0.5}}, headers=admin, timeout=30)
        assert r.status_code == 201, r.text
        in_flight = r.json()["run_id"]
        wait_until(lambda: (finished(old_base, admin, in_flight) is None
                            and run_status(url, in_flight) == "RUNNING"), 60, "the run to start", old_runner)

        # Step 1 of the deploy: this release's migrations, then its grants for the runner's role.
        upgraded = head_cli(url, "-m", "scrinalia.cli.main", "db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr
        assert revision(url) == migrate.head_revision() != release.schema_head
        granted = head_cli(url, "-m", "scrinalia.cli.main", "db", "runner-role", "--role", runner_role,
                           RUNNER_DB_PASSWORD=ROLE_PASSWORD)
        assert granted.returncode == 0, granted.stderr

        run = wait_until(lambda: finished(old_base, admin, in_flight), 120, "the run in flight", old_runner)
        assert run["status"] == "SUCCESS", (run, old_runner.log()[-3000:])

        # The previous release's API on the head schema: login, authenticated reads, its lockouts.
        admin = bearer(old_base, "admin@example.org")
        for path in ("/api/v1/auth/me", "/api/v1/system/runs", "/api/v1/system/runners", "/api/v1/system/workers"):
            r = httpx.get(f"{old_base}{path}", headers=admin, timeout=30)
            assert r.status_code == 200, (path, r.status_code, r.text, old_api.log()[-3000:])
        assert login(old_base, "early@example.org", PASSWORD).status_code == 423
        lock_out(old_base, "late@example.org")  # locked by the previous release, after the upgrade

        # Its runner claims what its API enqueues, and a real child runs the worker to SUCCESS.
        r = httpx.post(f"{old_base}/api/v1/system/workers/ok/runs", json={"options": {"units": 3}},
                       headers=admin, timeout=30)
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]

        run = wait_until(lambda: finished(old_base, admin, run_id), 120, "the previous runner to finish the run",
                         old_runner)
        assert run["status"] == "SUCCESS", (run, old_runner.log()[-3000:])
        assert str(run["runner_id"]) == old_runner_id

        # A worker of its catalogue that writes the archive (through this release's document triggers).
        r = httpx.post(f"{old_base}/api/v1/system/workers/cleaning/runs", json={}, headers=admin, timeout=30)
        assert r.status_code == 201, r.text
        cleaning_id = r.json()["run_id"]
        run = wait_until(lambda: finished(old_base, admin, cleaning_id), 120, "the cleaning run", old_runner)
        assert run["status"] == "SUCCESS", (run, old_runner.log()[-3000:])
        assert titles(url) == ["letter 1", "letter 2", "letter 3"]

        # Its scheduler fires a schedule added in the window, and its runner runs that too.
        old_cli(release, url, "scheduler", "add", "noop", "--every", "60")
        scheduled = wait_until(lambda: scheduled_run(url, "noop"), 120, "the scheduled run to finish", old_scheduler)
        assert scheduled == ("SUCCESS", old_runner_id), (scheduled, old_runner.log()[-3000:])

        # This release's API, started in the window (migrate -> API): the same lockouts hold for it, and it
        # reads what the previous release's runner wrote.
        with live_api(url, workers=1, cli=True, API_LOCKOUT_THRESHOLD=str(THRESHOLD),
                      API_LOGIN_RATE_LIMIT="1000") as new_api:
            for email in ("early@example.org", "late@example.org"):
                r = login(new_api.base, email, PASSWORD)
                assert r.status_code == 423, (email, r.status_code, r.text)
            head_admin = bearer(new_api.base, "admin@example.org")
            r = httpx.get(f"{new_api.base}/api/v1/system/runs/{run_id}", headers=head_admin, timeout=30)
            assert r.status_code == 200 and "SUCCESS" in r.text, r.text
            r = httpx.get(f"{new_api.base}/api/v1/system/runners", headers=head_admin, timeout=30)
            assert r.status_code == 200 and old_runner_id in r.text, r.text
        assert old_runner.proc.poll() is None, old_runner.log()[-3000:]
        assert "Traceback" not in old_api.log(), old_api.log()[-3000:]
        assert "Traceback" not in old_scheduler.log() and old_scheduler.proc.poll() is None, old_scheduler.log()
        old_runner.proc.send_signal(signal.SIGTERM)
        assert old_runner.proc.wait(timeout=60) == 0, old_runner.log()[-3000:]


def test_the_head_runner_refuses_the_previous_schema_and_a_rollback_returns_to_it(release, empty_database_url,
                                                                                 tmp_path):
    url = empty_database_url
    old_cli(release, url, "db", "upgrade")
    done = head_cli(url, "-m", "runner.cli", "daemon", "--name", "head", "--preload", "none",
                    "--socket", str(tmp_path / "head.sock"))
    assert done.returncode == migrate.EXIT_SCHEMA_BEHIND, done.stderr
    assert (f"the database schema is at revision {release.schema_head} but this runner needs "
            f"{migrate.head_revision()}; migrate first with `scrinalia db upgrade`") in done.stderr, done.stderr
    # The rollback (docs/operations.md, "Upgrading"): this release migrates up, then down to the previous
    # release's head, which that release's own check accepts again.
    for step in (["db", "upgrade"], ["db", "downgrade", release.schema_head]):
        done = head_cli(url, "-m", "scrinalia.cli.main", *step)
        assert done.returncode == 0, done.stderr
    assert "database: " + release.schema_head in old_cli(release, url, "db", "current")
