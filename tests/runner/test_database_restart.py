"""A database restart shorter than the lease fails no run (issue 9, defect 5; decision 0104): the children
try their batch (and their fetch) again on a new connection, the supervisor keeps its leases. A private
cluster, restarted for real with ``pg_ctl restart -m fast`` while runs are in flight."""
from __future__ import annotations

import subprocess
import time

import pytest
from sqlalchemy import text

from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from tests.foundation.clusters import create_database, private_cluster
from tests.runner import workers
from tests.runner.conftest import wait_for, wait_status

pytestmark = pytest.mark.slow

WORKERS = ("stamper-a", "stamper-b", "stamper-c")
UNITS = 40


def test_pg_ctl_restart_while_runs_are_in_flight_fails_no_run(start_runner, runner_env):
    with private_cluster() as cluster:
        url = create_database(cluster, "restart")
        engine = create_engine_from_url(url)
        try:
            with engine.begin() as conn:
                conn.execute(text(workers.STAMPER_TABLE_SQL))
                for w in WORKERS:
                    conn.execute(text("INSERT INTO fence_units (worker) SELECT :w FROM generate_series(1, :n)"),
                                 {"w": w, "n": UNITS})
            env = {**runner_env, "DATABASE_URL": url}
            runner = start_runner("--heartbeat", "1", "--lease", "12", "--poll", "0.2", "--concurrency", "3",
                                  "--capabilities", ",".join(WORKERS), env=env)
            runs = [ledger.enqueue(engine, w, {"options": {"pause": 0.15}}, requested_by="test") for w in WORKERS]
            for run in runs:
                runner.child_for(run.run_id)
            wait_for(lambda: _done(engine) >= 6, 30, what="a few batches committed")
            started = time.monotonic()
            restart = subprocess.run(
                cluster._as_server_user([str(cluster.bindir / "pg_ctl"), "-D", str(cluster.data_dir),
                                         "-l", str(cluster.data_dir.parent / "postgres.log"),
                                         "-m", "fast", "-w", "restart"]),
                capture_output=True, text=True, timeout=60)
            assert restart.returncode == 0, restart.stderr
            outage = time.monotonic() - started
            assert _done(engine) < len(WORKERS) * UNITS, "the runs ended before the restart: nothing was tested"
            rows = [wait_status(engine, run.run_id, ("SUCCESS", "FAILED", "INTERRUPTED"), timeout=90) for run in runs]
            assert [r.status for r in rows] == ["SUCCESS"] * len(runs), [(r.status, r.error) for r in rows]
            with engine.connect() as conn:
                counts = conn.execute(text("SELECT done_count, count(*) FROM fence_units GROUP BY done_count")).all()
            assert dict(counts) == {1: len(WORKERS) * UNITS}, counts  # every unit stamped exactly once
            assert "database" in runner.log()  # the outage was seen and said (outage %.1fs)
            print(f"restart took {outage:.2f}s")
        finally:
            engine.dispose()


def _done(engine) -> int:
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM fence_units WHERE done_by IS NOT NULL")).scalar_one()
    except Exception:
        return 0


def test_an_outage_longer_than_the_lease_ends_the_run_with_a_clear_reason(start_runner, runner_env):
    with private_cluster() as cluster:
        url = create_database(cluster, "outage")
        engine = create_engine_from_url(url)
        try:
            with engine.begin() as conn:
                conn.execute(text(workers.STAMPER_TABLE_SQL))
                conn.execute(text("INSERT INTO fence_units (worker) SELECT 'stamper-a' FROM generate_series(1, 400)"))
            runner = start_runner("--heartbeat", "1", "--lease", "4", "--poll", "0.2", "--capabilities", "stamper-a",
                                  env={**runner_env, "DATABASE_URL": url})
            run = ledger.enqueue(engine, "stamper-a", {"options": {"pause": 0.1}}, requested_by="test")
            child = runner.child_for(run.run_id)
            wait_for(lambda: _done(engine) >= 4, 30, what="a few batches committed")
            cluster.stop("fast")
            time.sleep(8)  # twice the lease
            cluster.start(fsync=False, max_connections=40)
            row = wait_status(engine, run.run_id, ("FAILED", "INTERRUPTED", "SUCCESS"), timeout=60)
            assert row.status in ("INTERRUPTED", "FAILED"), row
            first = row.error.splitlines()[0]
            print(f"outage: {row.status} {row.exit_reason}: {first}")
            assert first.startswith(("SelfFenced:", "DatabaseOutage:", "LeaseExpired:")), first
            assert row.error_fingerprint and row.exit_reason in ("lease-lost", "exception")
            wait_for(lambda: runner.status()["database"]["state"] == "ok", 30, what="the runner to reconnect")
            assert not any(c["run_id"] == str(run.run_id) for c in runner.children())
            assert child["pid"] not in [c["pid"] for c in runner.children()]
        finally:
            engine.dispose()
