"""What the runner checks before it claims anything: flags, the schema, the control socket."""
from __future__ import annotations

import importlib.util
import subprocess

from sqlalchemy import create_engine, text

from runner.options import EXIT_ALREADY_RUNNING, EXIT_SCHEMA_BEHIND, EXIT_USAGE
from tests.runner.conftest import ROOT, RUNNER


def _daemon(env, *flags, timeout=60):
    return subprocess.run([*RUNNER, "daemon", "--preload", "none", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_lease_that_does_not_exceed_the_heartbeat_is_refused(runner_env, tmp_path):
    done = _daemon(runner_env, "--name", "x", "--heartbeat", "15", "--lease", "15", "--socket", str(tmp_path / "s"))
    assert done.returncode == EXIT_USAGE
    assert "--lease (15 s) must exceed --heartbeat (15 s)" in done.stderr


def test_unknown_capabilities_are_refused(runner_env, tmp_path):
    done = _daemon(runner_env, "--name", "x", "--capabilities", "ok,nope", "--socket", str(tmp_path / "s"))
    assert done.returncode == EXIT_USAGE
    assert "nope" in done.stderr and "not in the catalogue" in done.stderr


def test_a_schema_that_is_behind_is_refused_with_a_clear_message(runner_env, database_url, tmp_path):
    eng = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with eng.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0001_initial'"))  # an older revision
    eng.dispose()
    done = _daemon(runner_env, "--name", "x", "--socket", str(tmp_path / "s"))
    assert done.returncode == EXIT_SCHEMA_BEHIND, done.stderr
    assert "the database schema is at revision 0001_initial but this runner needs" in done.stderr
    assert "scrinalia db upgrade" in done.stderr
    assert not (tmp_path / "s").exists()


def test_a_database_never_migrated_is_refused(runner_env, empty_database_url, tmp_path):
    env = dict(runner_env, DATABASE_URL=empty_database_url)
    done = _daemon(env, "--name", "x", "--socket", str(tmp_path / "s"))
    assert done.returncode == EXIT_SCHEMA_BEHIND
    assert "(none: never migrated)" in done.stderr


def test_a_second_runner_on_the_same_socket_is_refused(start_runner, runner_env):
    first = start_runner(name="same")
    done = _daemon(runner_env, "--name", "same", "--socket", str(first.socket_path))
    assert done.returncode == EXIT_ALREADY_RUNNING
    assert "already answers" in done.stderr
    assert first.status()["name"] == "same"


def test_make_dev_starts_its_runner_with_the_daemon_command(runner_env):
    """One way to start a daemon: ``scrinalia dev`` runs ``scrinalia-runner daemon`` (``-m runner.cli``),
    whose flags it passes as they are; the bridge module inside the domain package is gone."""
    from scrinalia.cli.dev import runner_argv

    assert importlib.util.find_spec("scrinalia.domains.archive.workers.runner_daemon") is None
    argv = runner_argv("x", 1, extra=["--heartbeat", "5", "--lease", "4"])
    assert argv[1:4] == ["-m", "runner.cli", "daemon"]
    done = subprocess.run(argv, cwd=ROOT, env=runner_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE
    assert "must exceed --heartbeat" in done.stderr
