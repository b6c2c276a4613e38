"""The version check tells the truth (issue 18): a schema behind the code says "migrate first" (exit 4), a
schema ahead of it (a revision this release does not know) says "upgrade this <process>" (exit 7), for
the runner (daemon and one-shot), the API and the scheduler at start; ``scrinalia db upgrade`` refuses a
database ahead of it in one line (exit 7), migrates one behind it, and refuses an unknown target (exit 2).
A schema ahead that declares this release compatible (decision 0392) is served by the API (``/healthz``
200) and the scheduler, with one warning line, and still refused by the runner. Real processes against a
real database whose revision is set as an older or a newer release leaves it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from runner import options as runner_options
from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.local_cluster import free_port
from tests.foundation.schema_revision import set_revision

ROOT = Path(__file__).resolve().parents[2]
FUTURE = "0099_from_a_newer_release"
OLDER = "0010"  # a revision of these migrations before the head


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "RUNNER_", "DB_", "PG"))}
    env.update(DATABASE_URL=url, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
               SCRINALIA_WORKER_PLUGINS="tests.runner.workers:ALL", API_COOKIE_SECURE="false")
    return env


def _set_revision(url: str, revision: str, oldest_compatible: str | None = None) -> None:
    engine = create_engine_from_url(url)
    try:
        set_revision(engine, revision, oldest_compatible)
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = create_engine_from_url(url)
    try:
        with engine.connect() as conn:
            return migrate.current_revision(conn)
    finally:
        engine.dispose()


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "runner": [sys.executable, "-m", "runner.cli", "daemon", "--name", "vc", "--preload", "none",
                   "--socket", str(tmp_path / "vc.sock")],
        "one-shot runner": [sys.executable, "-m", "runner.cli", "run", "ok"],
        "API": [sys.executable, "-m", "scrinalia.cli.main", "api", "--port", str(free_port())],
        "scheduler": [sys.executable, "-m", "scrinalia.cli.main", "scheduler", "run", "--interval", "0.5"],
    }


def _run(argv: list[str], url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=_env(url), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_the_exit_codes_agree_between_the_runner_and_the_other_processes():
    assert runner_options.EXIT_SCHEMA_BEHIND == migrate.EXIT_SCHEMA_BEHIND == 4
    assert runner_options.EXIT_SCHEMA_AHEAD == migrate.EXIT_SCHEMA_AHEAD == 7


@pytest.mark.parametrize("process", ["runner", "one-shot runner", "API", "scheduler"])
def test_a_schema_ahead_says_upgrade_this_process_with_exit_7(process, database_url, tmp_path):
    _set_revision(database_url, FUTURE)
    done = _run(_commands(tmp_path)[process], database_url)
    name = "runner" if process.endswith("runner") else process
    assert done.returncode == migrate.EXIT_SCHEMA_AHEAD, done.stdout + done.stderr
    assert (f"this {name} is older than the database's schema (revision {FUTURE}); upgrade this {name}"
            in done.stderr), done.stderr
    assert "migrate first" not in done.stderr and "Traceback" not in done.stderr
    assert _revision(database_url) == FUTURE  # nothing was changed


@pytest.mark.parametrize("process", ["runner", "one-shot runner"])
def test_the_runner_refuses_a_schema_ahead_even_when_it_declares_this_release_compatible(process, database_url,
                                                                                        tmp_path):
    _set_revision(database_url, FUTURE, oldest_compatible="0001_initial")
    done = _run(_commands(tmp_path)[process], database_url)
    assert done.returncode == migrate.EXIT_SCHEMA_AHEAD, done.stdout + done.stderr
    assert f"this runner is older than the database's schema (revision {FUTURE})" in done.stderr, done.stderr


def _warned_then_serving(proc: subprocess.Popen[str], component: str) -> list[str]:
    """The process's stderr lines up to its warning about the schema ahead (bounded), failing if it exits."""
    assert proc.stderr is not None
    deadline, lines = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "declares this release compatible: serving" in line:
            assert (f"warning: the database schema (revision {FUTURE}) is newer than this {component} "
                    f"({migrate.head_revision()})") in line, line
            return lines
    raise AssertionError(f"no warning line; exit {proc.poll()}:\n{''.join(lines)}")


def test_the_api_serves_a_schema_ahead_that_declares_this_release_compatible(database_url, tmp_path):
    _set_revision(database_url, FUTURE, oldest_compatible="0001_initial")
    argv = _commands(tmp_path)["API"]
    port = argv[argv.index("--port") + 1]
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(database_url), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        _warned_then_serving(proc, "API")
        deadline, health = time.monotonic() + 60, None
        while health is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health is not None, f"the API never answered (exit {proc.poll()})"
        assert health.status_code == 200, health.text
        assert health.json()["schema"] == "ahead_compatible" and health.json()["status"] == "ok"
        _set_revision(database_url, FUTURE)  # a later migration no longer declares it: degraded, as before
        refused = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert refused.status_code == 503 and refused.json()["schema"] == "ahead_or_unknown", refused.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert _revision(database_url) == FUTURE


def test_the_scheduler_serves_a_schema_ahead_that_declares_this_release_compatible(database_url, tmp_path):
    _set_revision(database_url, FUTURE, oldest_compatible=migrate.head_revision())
    proc = subprocess.Popen(_commands(tmp_path)["scheduler"], cwd=ROOT, env=_env(database_url),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        _warned_then_serving(proc, "scheduler")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    current = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "current"], database_url)
    assert current.returncode == 1
    assert "declares this release's API and scheduler compatible" in current.stdout, current.stdout


@pytest.mark.parametrize("process", ["runner", "one-shot runner", "API", "scheduler"])
def test_a_schema_behind_says_migrate_first_with_exit_4(process, database_url, tmp_path):
    _set_revision(database_url, OLDER)
    done = _run(_commands(tmp_path)[process], database_url)
    name = "runner" if process.endswith("runner") else process
    assert done.returncode == migrate.EXIT_SCHEMA_BEHIND, done.stdout + done.stderr
    assert (f"the database schema is at revision {OLDER} but this {name} needs {migrate.head_revision()}; "
            "migrate first with `scrinalia db upgrade`") in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_db_upgrade_on_a_schema_ahead_is_one_line_and_exit_7(database_url):
    _set_revision(database_url, FUTURE)
    done = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "upgrade"], database_url)
    assert done.returncode == migrate.EXIT_SCHEMA_AHEAD, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"this release is older than the database's schema (revision {FUTURE}); upgrade this release" in lines[0]
    assert _revision(database_url) == FUTURE
    current = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "current"], database_url)
    assert current.returncode == 1
    assert f"database: {FUTURE} (ahead of this release: a newer release migrated it" in current.stdout


def test_db_upgrade_of_an_unknown_target_is_a_usage_error(database_url):
    done = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "upgrade", "0042_nowhere"], database_url)
    assert done.returncode == 2, done.stderr
    assert "no migration has the revision '0042_nowhere'" in done.stderr and "Traceback" not in done.stderr


def test_db_upgrade_on_a_schema_behind_migrates_it(empty_database_url):
    migrate.upgrade(empty_database_url, OLDER)
    done = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "upgrade"], empty_database_url)
    assert done.returncode == 0, done.stderr
    assert _revision(empty_database_url) == migrate.head_revision()


def test_no_unit_restarts_on_a_schema_behind_or_ahead():
    """A restart fixes neither mismatch, so a unit that restarts on failure must not loop on 4 or 7."""
    units = sorted((ROOT / "systemd").glob("*.service"))
    assert units
    for unit in units:
        lines = [line.strip() for line in unit.read_text().splitlines()]
        if "Restart=on-failure" not in lines and "Restart=always" not in lines:
            continue
        prevented = {int(code) for line in lines if line.startswith("RestartPreventExitStatus=")
                     for code in line.split("=", 1)[1].split()}
        assert {migrate.EXIT_SCHEMA_BEHIND, migrate.EXIT_SCHEMA_AHEAD} <= prevented, unit.name


def test_db_downgrade_rolls_back_to_a_known_revision_and_refuses_an_unknown_one(database_url):
    done = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "downgrade", "0042_nowhere"], database_url)
    assert done.returncode == 2 and "no migration has the revision '0042_nowhere'" in done.stderr, done.stderr
    assert _revision(database_url) == migrate.head_revision()
    done = _run([sys.executable, "-m", "scrinalia.cli.main", "db", "downgrade", OLDER], database_url)
    assert done.returncode == 0, done.stderr
    assert _revision(database_url) == OLDER
