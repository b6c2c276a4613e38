"""What 200 open event streams cost a real API process (issue: the live surfaces hold).

One uvicorn worker against a fresh database; 200 streams opened by one asyncio client with a bearer
token; then the API's database connections (``pg_stat_activity``, its application names), the p50/p95
of 50 ``GET /api/v1/auth/me`` answered meanwhile, the frames each stream received in a 20 s window
(heartbeats every 3 s), and the transactions the streams cost in their steady state (the session check:
one every 2 s for all of them, decision 0141), from the database's commit counter, before the requests.

Run:  .venv/bin/python bench/bench_streams.py [--streams 200] [--window 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx
from sqlalchemy import text

from bench._pg import bench_database, percentile
from scrinalia.cli.dev import wait_http
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.local_cluster import free_port
from scrinalia.domains.identity.users import create_user

PASSWORD = "bench-password-123456"


def _api_connections(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'scrinalia-api%' GROUP BY 1")).all()
    return {r[0]: int(r[1]) for r in rows}


def _commits(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                     "WHERE datname = current_database()")).scalar_one())


async def _streams(base: str, token: str, n: int, window: float, engine) -> tuple[list[int], list[float], float]:
    frames = [0] * n
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=httpx.Timeout(60, read=60)) as client:
        async def one(i: int) -> None:
            async with client.stream("GET", "/api/v1/system/events") as r:
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        frames[i] += 1

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while sum(1 for f in frames if f) < n:  # every stream has its hello
            await asyncio.sleep(0.1)
        # PostgreSQL flushes a backend's counters up to 10 s after its last transaction: the 200
        # session lookups of the opens would be counted in the window
        await asyncio.sleep(11)
        # the steady state first, with nothing else asked: the session check (and the heartbeats, which
        # cost the database nothing)
        commits = await asyncio.to_thread(_commits, engine)
        quiet = time.monotonic()
        await asyncio.sleep(window)
        rate = (await asyncio.to_thread(_commits, engine) - commits) / (time.monotonic() - quiet)
        latencies = []
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            started = time.perf_counter()
            assert (await client.get("/api/v1/auth/me")).status_code == 200
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(window / 50)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return frames, latencies, rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    with bench_database("streams") as url:
        engine = create_engine_from_url(url)
        create_user(engine, "bench@example.org", PASSWORD, "VIEWER")
        port = free_port()
        env = {**os.environ, "DATABASE_URL": url, "API_COOKIE_SECURE": "false", "PYTHONPATH": str(ROOT)}
        log = open(Path(tempfile.mkdtemp()) / "api.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
                                 "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            assert wait_http(f"{base}/healthz", 60, alive=lambda: proc.poll() is None)
            token = httpx.post(f"{base}/api/v1/auth/login", json={"email": "bench@example.org", "password": PASSWORD,
                                                                   "issue_token": True}).json()["token"]
            idle_before = _commits(engine)
            time.sleep(args.window)
            idle = (_commits(engine) - idle_before) / args.window
            frames, latencies, with_streams = asyncio.run(_streams(base, token, args.streams, args.window, engine))
            connections = _api_connections(engine)
        finally:
            proc.terminate()
            proc.wait(30)
            engine.dispose()
    print(json.dumps({
        "streams": args.streams,
        "api_db_connections": connections,
        "me_samples": len(latencies),
        "me_ms_p50": round(percentile(latencies, 0.5), 1), "me_ms_p95": round(percentile(latencies, 0.95), 1),
        "frames_per_stream_min": min(frames), "frames_per_stream_max": max(frames),
        "db_transactions_per_s_idle": round(idle, 2),
        "db_transactions_per_s_with_streams": round(with_streams, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
