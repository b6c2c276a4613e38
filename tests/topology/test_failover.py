"""A failover to a promoted standby fails no run, with libpq's multi-host URL (issue 18).

A primary and a synchronous streaming standby; the runner daemon, its children and the API are given
``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write`` (the URL a Patroni
or managed-PostgreSQL guide prints; the migrations ran through it too). With three runs in flight the
primary is stopped with ``pg_ctl stop -m immediate`` and the standby promoted: every run ends SUCCESS,
every unit is stamped exactly once, and the runner and the API serve from the new primary within seconds.
The reconnect times are measured by bench/bench_pgbouncer.py (docs/benchmarks.md)."""
from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import text

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from tests.api.conftest import PASSWORD, add_user
from tests.api.live import live_api
from tests.foundation.clusters import psql
from tests.runner import workers
from tests.runner.conftest import wait_for, wait_status
from tests.topology.standby import primary_and_standby

pytestmark = pytest.mark.slow

WORKERS = ("stamper-a", "stamper-b", "stamper-c")
UNITS = 40


def test_a_promoted_standby_fails_no_run_with_libpq_s_multi_host_url(start_runner, runner_env):
    with primary_and_standby() as pair:
        psql(pair.primary, "postgres", 'CREATE DATABASE "failover"')
        url = pair.url("failover")
        migrate.upgrade(url)
        engine = create_engine_from_url(url)
        try:
            with engine.begin() as conn:
                conn.execute(text(workers.STAMPER_TABLE_SQL))
                for w in WORKERS:
                    conn.execute(text("INSERT INTO fence_units (worker) SELECT :w FROM generate_series(1, :n)"),
                                 {"w": w, "n": UNITS})
            add_user(engine, "ops@example.org", "ADMIN")
            runner = start_runner("--heartbeat", "1", "--lease", "12", "--poll", "0.2", "--concurrency", "3",
                                  "--capabilities", ",".join(WORKERS), env={**runner_env, "DATABASE_URL": url})
            with live_api(url, workers=1) as api:
                login = httpx.post(f"{api.base}/api/v1/auth/login", timeout=30,
                                   json={"email": "ops@example.org", "password": PASSWORD, "issue_token": True})
                assert login.status_code == 200, login.text
                headers = {"Authorization": f"Bearer {login.json()['token']}"}
                runs = [ledger.enqueue(engine, w, {"options": {"pause": 0.15}}, requested_by="test") for w in WORKERS]
                for run in runs:
                    runner.child_for(run.run_id)
                wait_for(lambda: _done(engine) >= 6, 30, what="a few batches committed")

                promoted = pair.fail_over()
                assert _done(engine) < len(WORKERS) * UNITS, "the runs ended before the failover: nothing was tested"

                def runner_renewed() -> bool:  # a heartbeat renewed on the new primary
                    db = runner.status()["database"]
                    age = db["last_heartbeat_age_seconds"]
                    return db["state"] == "ok" and age is not None and age < time.monotonic() - promoted

                wait_for(runner_renewed, 20, what="the runner to renew its lease on the new primary")
                runner_back = time.monotonic() - promoted
                wait_for(lambda: _api_reads(api.base, headers), 20, what="the API to serve from the new primary")
                api_back = time.monotonic() - promoted

                rows = [wait_status(engine, r.run_id, ("SUCCESS", "FAILED", "INTERRUPTED"), timeout=90) for r in runs]
                assert [r.status for r in rows] == ["SUCCESS"] * len(runs), [(r.status, r.error) for r in rows]
                with engine.connect() as conn:
                    counts = conn.execute(
                        text("SELECT done_count, count(*) FROM fence_units GROUP BY done_count")).all()
                    assert not conn.execute(text("SELECT pg_is_in_recovery()")).scalar_one()  # the new primary
                assert dict(counts) == {1: len(WORKERS) * UNITS}, counts  # every unit stamped exactly once
                assert _api_reads(api.base, headers)
                print(f"runner renewed {runner_back:.2f}s and API served {api_back:.2f}s after the promotion")
        finally:
            engine.dispose()


def _api_reads(base: str, headers: dict[str, str]) -> bool:
    try:
        health = httpx.get(f"{base}/healthz", timeout=5)
        runs = httpx.get(f"{base}/api/v1/system/runs", headers=headers, timeout=5)
    except httpx.HTTPError:
        return False
    return health.status_code == 200 and runs.status_code == 200


def _done(engine) -> int:
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM fence_units WHERE done_by IS NOT NULL")).scalar_one()
    except Exception:
        return 0
