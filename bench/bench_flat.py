"""Flat over many runs and many streams (issue 29). Two parts, one API process throughout:

1. Runs: one supervisor serves ``--runs`` runs back to back (a time-compressed cadence: heartbeat 1 s,
   lease 10 s, no pause between runs) while ``--watchers`` panels keep the API's event stream open (every
   run's changes are relayed to them); every ``--every`` finished runs the supervisor's, the fork
   server's and the API's resident memory, open file descriptors and threads, and the database
   connections of the runner and of the API, are sampled.
2. Streams: ``--streams`` connects and disconnects of the event stream (``--parallel`` at a time; a third
   leave as soon as the answer's headers arrive, the others after the ``hello``), the API sampled every
   ``--every`` connects.

After a warm-up (the first sample of each part) growth must stay <= 5%, and nothing must be left open:
the daemon drained (no child, no standby, no connection of the runner); after the streams, the API back
to what it held before them; the API stopped, none of its connections.

Eight ``bench-noop-NN`` workers (one active run each: the worker's slot) keep ``--concurrency`` children
busy; each run is a child forked (or handed to the standby), a claim, ``record_start``, a finish.

Run:  .venv/bin/python bench/bench_flat.py [--runs 20000] [--streams 5000] [--every 1000] [--concurrency 4]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx
from sqlalchemy import text

from bench._pg import bench_database
from bench.bench_runner import Daemon, _env
from scrinalia.cli.dev import wait_http
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.local_cluster import free_port
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import WorkerRunAlreadyActive
from scrinalia.domains.identity.users import create_user

WORKERS = [f"bench-noop-{i:02d}" for i in range(8)]
PASSWORD = "bench-password-123456"
EVENTS = "/api/v1/system/events"


def process(pid: int) -> dict[str, int]:
    """RSS (bytes), open file descriptors and threads of a process, from /proc."""
    out = {"rss": 0, "threads": 0, "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    return out


def connections(engine: Any, who: str = "scrinalia-runner") -> int:
    """The database connections whose application_name starts with ``who``."""
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE :who"), {"who": f"{who}%"}).scalar_one())


def finished(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM archive_worker_runs WHERE status IN ('SUCCESS', 'FAILED')")).scalar_one())


def sample(daemon: Daemon, api: subprocess.Popen, engine: Any, done: int, started: float) -> dict[str, Any]:
    status = daemon.status()
    return {"runs": done, "seconds": round(time.monotonic() - started, 1),
            "supervisor": process(daemon.proc.pid), "fork_server": process(status["launcher"]["pid"]),
            "api": process(api.pid), "runner_connections": connections(engine),
            "api_connections": connections(engine, "scrinalia-api")}


def growth(first: dict[str, Any], last: dict[str, Any]) -> dict[str, float]:
    out = {}
    for who in ("supervisor", "fork_server", "api"):
        if who not in first:
            continue
        for what in ("rss", "fds", "threads"):
            a, b = first[who][what], last[who][what]
            out[f"{who}_{what}"] = round((b - a) / a * 100, 2) if a else 0.0
    for what in ("runner_connections", "api_connections"):
        if what in first:
            out[what] = last[what] - first[what]  # a count, not a percentage
    return out


def start_api(url: str, tmpdir: str) -> tuple[subprocess.Popen, str]:
    """One uvicorn worker of the API (the bench's workers in its catalogue: their events are relayed)."""
    port = free_port()
    env = {**_env(url), "API_COOKIE_SECURE": "false"}
    log = open(Path(tmpdir) / "api.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    if not wait_http(f"{base}/healthz", 60, alive=lambda: proc.poll() is None):
        raise RuntimeError("the API did not start")
    return proc, base


class Watchers:
    """``n`` panels with the event stream open during the runs, each on a thread; a stream that ends
    (its five minutes) is opened again, as the browser does."""

    def __init__(self, base: str, token: str, n: int) -> None:
        self.base, self.token = base, token
        self.frames = [0] * n
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._watch, args=(i,), daemon=True) for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _watch(self, i: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.base, headers=headers, timeout=httpx.Timeout(10, read=10)) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("GET", EVENTS) as answer:
                        for line in answer.iter_lines():
                            if line.startswith("event: "):
                                self.frames[i] += 1
                            if self.stop.is_set():
                                return
                except httpx.HTTPError:
                    time.sleep(0.5)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


async def churn(base: str, token: str, n: int, parallel: int, every: int, api: subprocess.Popen, engine: Any,
                samples: list[dict[str, Any]]) -> dict[str, int]:
    """``n`` connects and disconnects of the event stream, ``parallel`` at a time; the API sampled every
    ``every`` connects."""
    counts = {"connects": 0, "hello": 0, "headers_only": 0, "refused": 0}
    started = time.monotonic()
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=0)  # each connect a new socket
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=httpx.Timeout(30)) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)

        async def one(i: int) -> None:
            async with client.stream("GET", EVENTS) as answer:
                counts["connects"] += 1
                if answer.status_code != 200:
                    counts["refused"] += 1
                    return
                if i % 3 == 0:
                    counts["headers_only"] += 1
                    return  # leave before the first frame
                async for line in answer.aiter_lines():
                    if line == "event: hello":
                        counts["hello"] += 1
                        return

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await one(i)
                if (i + 1) % every == 0:
                    sample = {"streams": i + 1, "seconds": round(time.monotonic() - started, 1),
                              "api": process(api.pid),
                              "api_connections": await asyncio.to_thread(connections, engine, "scrinalia-api")}
                    samples.append(sample)
                    print(json.dumps(sample), file=sys.stderr, flush=True)

        await asyncio.gather(*(worker() for _ in range(parallel)))
    return counts


def settle(api: subprocess.Popen, engine: Any, seconds: float = 6.0) -> dict[str, Any]:
    """The API ``seconds`` after the last stream left (a stream whose client went away is ended by its
    next heartbeat's write, within 3 s)."""
    time.sleep(seconds)
    return {"api": process(api.pid), "api_connections": connections(engine, "scrinalia-api")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--parallel", type=int, default=8, help="streams connecting at a time")
    parser.add_argument("--watchers", type=int, default=2, help="streams open during the runs")
    args = parser.parse_args()
    results: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "load": os.getloadavg(),
                               "runs": args.runs, "concurrency": args.concurrency, "streams": args.streams}
    with bench_database("bench_flat") as url, tempfile.TemporaryDirectory() as tmpdir:
        engine = create_engine_from_url(url)
        create_user(engine, "bench@example.org", PASSWORD, "VIEWER")
        api, base = start_api(url, tmpdir)
        try:
            token = httpx.post(f"{base}/api/v1/auth/login", json={"email": "bench@example.org", "password": PASSWORD,
                                                                   "issue_token": True}).json()["token"]
            if args.runs:
                results.update(runs_part(args, url, tmpdir, engine, api, base, token))
            if args.streams:
                results.update(streams_part(args, engine, api, base, token))
        finally:
            api.terminate()
            api.wait(30)
        results["api_connections_after_stop"] = connections(engine, "scrinalia-api")
        engine.dispose()
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))


def runs_part(args: argparse.Namespace, url: str, tmpdir: str, engine: Any, api: subprocess.Popen, base: str,
              token: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    watchers = Watchers(base, token, args.watchers)
    daemon = Daemon(url, Path(tmpdir), "flat", "--capabilities", ",".join(WORKERS), "--concurrency",
                    str(args.concurrency), "--preload", "none")
    samples: list[dict[str, Any]] = []
    enqueued, started = 0, time.monotonic()
    try:
        try:
            next_sample = args.every
            while True:
                for worker in WORKERS:
                    if enqueued >= args.runs:
                        break
                    try:
                        ledger.enqueue(engine, worker, {}, requested_by="bench")
                        enqueued += 1
                    except WorkerRunAlreadyActive:
                        pass
                done = finished(engine)
                if done >= next_sample:
                    samples.append(sample(daemon, api, engine, done, started))
                    print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                    next_sample += args.every
                if done >= args.runs:
                    break
                time.sleep(0.002)
        finally:
            daemon.stop()
    finally:
        watchers.close()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM archive_worker_runs GROUP BY status")).all()
    results["statuses"] = {str(status): int(count) for status, count in rows}
    results["daemon_exit_code"] = daemon.proc.returncode
    results["runner_connections_after_stop"] = connections(engine)
    results["watcher_frames"] = watchers.frames
    results["run_samples"] = samples
    if len(samples) >= 2:
        results["run_growth_percent_after_warm_up"] = growth(samples[0], samples[-1])
    return results


def streams_part(args: argparse.Namespace, engine: Any, api: subprocess.Popen, base: str,
                 token: str) -> dict[str, Any]:
    before = {"api": process(api.pid), "api_connections": connections(engine, "scrinalia-api")}
    samples: list[dict[str, Any]] = []
    counts = asyncio.run(churn(base, token, args.streams, args.parallel, args.every, api, engine, samples))
    after = settle(api, engine)
    results: dict[str, Any] = {"stream_counts": counts, "api_before_streams": before,
                               "api_after_streams": after, "stream_samples": samples}
    if len(samples) >= 2:
        results["stream_growth_percent_after_warm_up"] = growth(samples[0], samples[-1])
    return results


if __name__ == "__main__":
    main()
