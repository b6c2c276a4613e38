"""The database's state named truthfully: "blocked" (a lock or statement timeout while the server answers)
vs "unreachable" (no connection), in the classification, the supervisor's status and log, and the CLIs
(issue 9, defect 6; decision 0103)."""
from __future__ import annotations

import subprocess

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.errors import classify_database_error, database_problem
from scrinalia.db.local_cluster import free_port
from tests.runner.conftest import ROOT, RUNNER, wait_for


def _error_of(engine, sql: str, before: str | None = None) -> DBAPIError:
    with pytest.raises(DBAPIError) as caught:
        with engine.connect() as conn:
            if before:
                conn.execute(text(before))
            conn.execute(text(sql))
    return caught.value


def test_a_lock_timeout_and_a_statement_timeout_are_blocked(engine):
    with engine.connect() as holder:
        holder.execute(text("LOCK TABLE archive_worker_settings IN ACCESS EXCLUSIVE MODE"))
        lock = _error_of(engine, "SELECT * FROM archive_worker_settings", "SET lock_timeout = 200")
        holder.rollback()
    assert classify_database_error(lock) == "blocked"
    assert database_problem(lock).startswith("the database is blocked: it answers")
    slow = _error_of(engine, "SELECT pg_sleep(2)", "SET statement_timeout = 100")
    assert classify_database_error(slow) == "blocked"


def test_no_connection_is_unreachable_and_another_error_is_an_error(engine):
    down = create_engine_from_url(f"postgresql://nobody@127.0.0.1:{free_port()}/none",
                                  connect_args={"connect_timeout": 2})
    try:
        refused = _error_of(down, "SELECT 1")
    finally:
        down.dispose()
    assert classify_database_error(refused) == "unreachable"
    assert database_problem(refused).startswith("the database does not answer (")
    assert classify_database_error(_error_of(engine, "SELECT * FROM no_such_table")) == "error"


def test_status_all_with_the_database_down_is_one_line_and_exit_5(runner_env):
    env = {**runner_env, "DATABASE_URL": f"postgresql://nobody:secret@127.0.0.1:{free_port()}/none"}
    proc = subprocess.run([*RUNNER, "status", "--all"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("scrinalia-runner: the database does not answer (")
    assert "secret" not in proc.stderr


@pytest.mark.slow
def test_the_supervisor_says_blocked_while_its_heartbeat_waits_on_a_lock(start_runner, engine):
    runner = start_runner("--heartbeat", "1", "--lease", "20", "--poll", "0.5", "--capabilities", "ok")
    runner_id = runner.status()["runner_id"]
    with engine.connect() as holder:  # a stuck session holds the runner's registry row
        holder.execute(text("SELECT 1 FROM archive_worker_runners WHERE runner_id = :r FOR UPDATE"),
                       {"r": runner_id})
        state = wait_for(lambda: runner.status()["database"]["state"] == "blocked" and runner.status(), 30,
                         what="the status to say blocked")
        # The server's bound fires before the client's guard (decision 0110): the lock is named, not a shut socket.
        assert state["database"]["error"] in ("LockNotAvailable", "QueryCanceled")
        holder.rollback()
    wait_for(lambda: runner.status()["database"]["state"] == "ok", 30, what="the database to answer again")
    log = runner.log()
    assert "database blocked: heartbeat failed" in log and "database: answers again" in log
