"""50 parallel POSTs for one worker against a real `scrinalia api --workers 2` (two processes, one
database): exactly one 201, the other 49 are 409 with the active run. The slot is PostgreSQL's."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from scrinalia.cli.dev import wait_http
from scrinalia.db.local_cluster import free_port
from tests.api.conftest import PASSWORD, add_user

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def live_api(database_url):
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SCRINALIA_WORKER_PLUGINS": "tests.api.workers_fixture:WORKERS",
        "API_COOKIE_SECURE": "false",
        "DB_POOL_SIZE": "10",
        "DB_POOL_MAX_OVERFLOW": "20",
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrinalia.cli.main", "api", "--port", str(port), "--workers", "2",
         "--log-level", "warning"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    if not wait_http(f"{base}/healthz", 60, alive=lambda: proc.poll() is None):
        if proc.poll() is not None:
            raise RuntimeError(proc.stdout.read().decode(errors="replace"))
        proc.terminate()
        raise RuntimeError("the API did not start")
    try:
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_fifty_parallel_posts_give_exactly_one_201(live_api, engine):
    add_user(engine, "ops@example.org", "ADMIN")
    r = httpx.post(f"{live_api}/api/v1/auth/login",
                   json={"email": "ops@example.org", "password": PASSWORD, "issue_token": True}, timeout=30)
    assert r.status_code == 200, r.text
    headers = {"Authorization": f"Bearer {r.json()['token']}"}

    with httpx.Client(base_url=live_api, headers=headers, timeout=60,
                      limits=httpx.Limits(max_connections=50)) as client:
        def post(_):
            return client.post("/api/v1/system/workers/alpha/runs", json={"db_batch_size": 4})

        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(post, range(50)))

    codes = sorted(a.status_code for a in answers)
    assert codes.count(201) == 1 and codes.count(409) == 49, codes
    winner = next(a.json() for a in answers if a.status_code == 201)
    assert {a.json()["active_run"]["run_id"] for a in answers if a.status_code == 409} == {winner["run_id"]}
    from sqlalchemy import text

    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one() == 1
