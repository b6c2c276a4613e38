"""PgBouncer in transaction mode between every process and PostgreSQL (issue 18; decisions 0121-0123).

A real PgBouncer (Debian's package) with its default settings plus the one docs/install.md documents
(``ignore_startup_parameters``), in front of the session's cluster. Through it: no server-side prepared
statement (none fails, none is logged), the session bounds hold per transaction (a child's statement
that outlives its bound is cancelled; a locked registry row reads "blocked"), the runner's LISTEN is found
deaf, said once, and the poll picks up within --poll + 1 s; the API answers its reads. The long version
(5 minutes of claiming) is bench/bench_pgbouncer.py.
"""
from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from scrinalia.domains.archive import ledger
from tests.api.conftest import PASSWORD, add_user
from tests.api.live import live_api
from tests.runner.conftest import ROOT, RUNNER, enqueue, wait_for, wait_status
from tests.topology.pgbouncer import DOCUMENTED_SETTINGS, PgBouncer, pgbouncer

pytestmark = pytest.mark.slow

PLUGINS = "tests.runner.workers:ALL,tests.topology.workers:ALL"
PREPARED_ERRORS = re.compile(r"prepared statement|_pg3_\d|DuplicatePreparedStatement|InvalidSqlStatementName")


@pytest.fixture
def bouncer(pg_admin_url: str) -> Iterator[PgBouncer]:
    with pgbouncer(make_url(pg_admin_url).port or 5432, settings=DOCUMENTED_SETTINGS) as running:
        yield running


def through(bouncer: PgBouncer, url: str) -> str:
    """The same database, through the pooler."""
    return make_url(url).set(host="127.0.0.1", port=bouncer.port).render_as_string(hide_password=False)


def test_pgbouncer_s_defaults_refuse_us_and_the_documented_setting_lets_us_in(pg_admin_url, database_url):
    server_port = make_url(pg_admin_url).port or 5432
    with pgbouncer(server_port) as plain:  # its defaults: libpq's options are an unknown startup parameter
        with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
            psycopg.connect(through(plain, database_url), options="-c statement_timeout=1000").close()
    with pgbouncer(server_port, settings=DOCUMENTED_SETTINGS) as documented:
        psycopg.connect(through(documented, database_url), options="-c statement_timeout=1000").close()


def test_through_pgbouncer_runs_end_success_bounds_hold_and_the_poll_covers_a_deaf_listen(
        start_runner, runner_env, engine, bouncer, database_url):
    env = {**runner_env, "DATABASE_URL": through(bouncer, database_url), "SCRINALIA_WORKER_PLUGINS": PLUGINS}
    runner = start_runner("--poll", "0.5", "--heartbeat", "1", "--lease", "6", "--concurrency", "2", env=env)
    # The LISTEN is accepted by the pooler but hears nothing: found by the probe, said once, polled.
    wait_for(lambda: runner.status()["notifications"]["state"] == "deaf", 30, what="the LISTEN to be found deaf")
    assert runner.log().count("notifications do not arrive") == 1, runner.log()
    assert "RUNNER_DATABASE_SESSION_URL" in runner.log()

    # Pick-up within --poll + 1 s, by the database's clock (queued -> claimed).
    picked = wait_status(engine, enqueue(engine, "ok").run_id, "SUCCESS", timeout=30)
    assert picked.started_at is not None and (picked.started_at - picked.queued_at).total_seconds() <= 0.5 + 1.0

    # A child's session bounds hold through the pooler: read back, and a statement that outlives one ends.
    bounds = wait_status(engine, enqueue(engine, "session-settings").run_id, "SUCCESS", timeout=30).result
    assert (bounds["statement_timeout"], bounds["lock_timeout"], bounds["idle_in_transaction_session_timeout"]) \
        == ("3s", "1500ms", "3s"), bounds
    cancelled = wait_status(engine, enqueue(engine, "outlives-its-bound", seconds=30).run_id, "SUCCESS",
                            timeout=60).result
    assert cancelled["sqlstate"] == "57014" and 2.5 <= cancelled["after"] < 10, cancelled  # query_canceled at 3 s

    # Two concurrent runs, then twenty more (one active run per worker: twenty workers): every one SUCCESS.
    first = [enqueue(engine, w, units=6, pause=0.1) for w in ("slow", "slow-b")]
    wait_for(lambda: sum(c["phase"] == "running" for c in runner.children()) == 2, 30, what="two concurrent children")
    more = [enqueue(engine, w, units=3, pause=0.0) for w in [f"sleepy-{i:02d}" for i in range(16)]
            + ["ok", "noop", "committer", "sessions"]]
    rows = [wait_status(engine, r.run_id, ("SUCCESS", "FAILED", "INTERRUPTED"), timeout=120) for r in first + more]
    assert [r.status for r in rows] == ["SUCCESS"] * 22, [(r.status, r.error) for r in rows]
    assert not PREPARED_ERRORS.search(runner.log()), runner.log()[-3000:]
    assert not PREPARED_ERRORS.search(bouncer.log())
    assert runner.status()["database"]["state"] == "ok"


def test_a_direct_session_url_gives_the_runner_a_listen_that_hears(start_runner, runner_env, engine, bouncer,
                                                                   database_url):
    # A password the test cluster's trust authentication ignores, and that no log line may show.
    direct = make_url(database_url).set(password="listen-secret-pw").render_as_string(hide_password=False)
    env = {**runner_env, "DATABASE_URL": through(bouncer, database_url), "RUNNER_DATABASE_SESSION_URL": direct}
    runner = start_runner("--poll", "5", "--heartbeat", "1", "--lease", "8", "--capabilities", "ok", env=env)
    wait_for(lambda: runner.status()["notifications"]["state"] == "hears", 30, what="the LISTEN to hear")
    run = wait_status(engine, enqueue(engine, "ok").run_id, "SUCCESS", timeout=30)
    assert (run.started_at - run.queued_at).total_seconds() < 2.5  # on the notification, not the 5 s poll
    assert "notifications do not arrive" not in runner.log()
    assert "RUNNER_DATABASE_SESSION_URL" in runner.log() and "listen-secret-pw" not in runner.log()


def test_the_one_shot_cli_through_pgbouncer_has_its_child_bounded(runner_env, bouncer, database_url):
    env = {**runner_env, "DATABASE_URL": through(bouncer, database_url)}
    proc = subprocess.run([*RUNNER, "run", "session-settings", "--lease", "8", "--heartbeat", "2", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert (result["statement_timeout"], result["lock_timeout"], result["idle_in_transaction_session_timeout"]) \
        == ("4s", "2s", "4s"), result
    assert not PREPARED_ERRORS.search(proc.stderr)


def test_a_locked_registry_row_reads_blocked_through_pgbouncer(start_runner, runner_env, engine, bouncer,
                                                                database_url):
    env = {**runner_env, "DATABASE_URL": through(bouncer, database_url)}
    runner = start_runner("--heartbeat", "1", "--lease", "20", "--poll", "0.5", "--capabilities", "ok", env=env)
    runner_id = runner.status()["runner_id"]
    with engine.connect() as holder:  # a direct session holds the runner's registry row
        holder.execute(text("SELECT 1 FROM archive_worker_runners WHERE runner_id = :r FOR UPDATE"), {"r": runner_id})
        def blocked():
            status = runner.status()  # one snapshot: the claims still answer between two heartbeats
            return status if status["database"]["state"] == "blocked" else None

        state = wait_for(blocked, 30, what="the status to say blocked")
        assert state["database"]["error"] in ("LockNotAvailable", "QueryCanceled")
        holder.rollback()
    wait_for(lambda: runner.status()["database"]["state"] == "ok", 30, what="the database to answer again")


def test_the_api_answers_a_hundred_reads_through_pgbouncer_and_says_its_listen_is_deaf(engine, bouncer,
                                                                                        database_url):
    add_user(engine, "ops@example.org", "ADMIN")
    run = ledger.enqueue(engine, "alpha", {}, requested_by="test")
    with live_api(through(bouncer, database_url), workers=1) as api:
        login = httpx.post(f"{api.base}/api/v1/auth/login",
                           json={"email": "ops@example.org", "password": PASSWORD, "issue_token": True}, timeout=30)
        assert login.status_code == 200, login.text
        headers = {"Authorization": f"Bearer {login.json()['token']}"}
        paths = ["/api/v1/system/runs", f"/api/v1/system/runs/{run.run_id}", "/api/v1/system/workers",
                 "/api/v1/system/runners", "/healthz"]
        with httpx.Client(base_url=api.base, headers=headers, timeout=30) as client:
            codes = [client.get(paths[i % len(paths)]).status_code for i in range(100)]
            assert codes == [200] * 100, codes
            with client.stream("GET", "/api/v1/system/events") as stream:  # opens the hub's LISTEN
                hello = next(line for line in stream.iter_lines() if line.startswith("data:"))
                assert '"listening":false' in hello  # not trusted before its probe comes back
                wait_for(lambda: client.get("/healthz").json()["notifications"] == "deaf", 30,
                         what="the API to find its LISTEN deaf")
        log = api.log()
    assert log.count("notifications do not arrive") == 1, log
    assert not PREPARED_ERRORS.search(log), log[-3000:]


def test_the_scheduler_s_lock_needs_a_session_and_says_so_through_pgbouncer(engine, bouncer, database_url, caplog):
    from scrinalia.db.engine import create_engine_from_url
    from scrinalia.scheduler.service import SESSION_BOUNDS, Scheduler

    pooled = create_engine_from_url(through(bouncer, database_url), connect_args=dict(SESSION_BOUNDS))
    direct = create_engine_from_url(database_url, pool_size=1)
    try:
        for leader_engine, expected in ((direct, True), (None, False)):  # (a lock left in a pooled session stays)
            scheduler = Scheduler(pooled, catalogue={}, leader_engine=leader_engine)
            assert scheduler.tick().leader
            # Another client's transaction takes the server session the lock was taken on (the pooler
            # lends its most recent one first): the lock's connection is handed another session.
            with psycopg.connect(through(bouncer, database_url), prepare_threshold=None) as other:
                other.execute("SELECT 1")
                assert scheduler.tick().leader is expected
            scheduler.release()
    finally:
        pooled.dispose()
        direct.dispose()
    assert caplog.text.count("the leader lock's session changed under its connection") == 1
