"""Flat over many runs: one supervisor serves ``--runs`` runs back to back (a time-compressed cadence:
heartbeat 1 s, lease 10 s, no pause between runs), and every ``--every`` finished runs the supervisor's and
the fork server's resident memory, open file descriptors and threads, and the database connections of
the runner, are sampled. After a warm-up (the first sample), growth must stay <= 5% and nothing must be
left open at the end (the daemon drained: no child, no standby, no connection of the runner).

Eight ``bench-noop-NN`` workers (one active run each: the worker's slot) keep ``--concurrency`` children
busy; each run is a child forked (or handed to the standby), a claim, ``record_start``, a finish.

Run:  .venv/bin/python bench/bench_flat.py [--runs 20000] [--every 1000] [--concurrency 4]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text

from bench._pg import bench_database
from bench.bench_runner import Daemon
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import WorkerRunAlreadyActive

WORKERS = [f"bench-noop-{i:02d}" for i in range(8)]


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


def connections(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'scrinalia-runner%'")).scalar_one())


def finished(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM archive_worker_runs WHERE status IN ('SUCCESS', 'FAILED')")).scalar_one())


def sample(daemon: Daemon, engine: Any, done: int, started: float) -> dict[str, Any]:
    status = daemon.status()
    return {"runs": done, "seconds": round(time.monotonic() - started, 1),
            "supervisor": process(daemon.proc.pid), "fork_server": process(status["launcher"]["pid"]),
            "runner_connections": connections(engine)}


def growth(first: dict[str, Any], last: dict[str, Any]) -> dict[str, float]:
    out = {}
    for who in ("supervisor", "fork_server"):
        for what in ("rss", "fds", "threads"):
            a, b = first[who][what], last[who][what]
            out[f"{who}_{what}"] = round((b - a) / a * 100, 2) if a else 0.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    results: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "load": os.getloadavg(),
                               "runs": args.runs, "concurrency": args.concurrency}
    with bench_database("bench_flat") as url, tempfile.TemporaryDirectory() as tmpdir:
        engine = create_engine_from_url(url)
        daemon = Daemon(url, Path(tmpdir), "flat", "--capabilities", ",".join(WORKERS), "--concurrency",
                        str(args.concurrency), "--preload", "none")
        samples, enqueued, started = [], 0, time.monotonic()
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
                    samples.append(sample(daemon, engine, done, started))
                    print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                    next_sample += args.every
                if done >= args.runs:
                    break
                time.sleep(0.002)
        finally:
            daemon.stop()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT status, count(*) FROM archive_worker_runs GROUP BY status")).all()
        results["statuses"] = {str(status): int(count) for status, count in rows}
        results["runner_connections_after_stop"] = connections(engine)
        engine.dispose()
    results["samples"] = samples
    if len(samples) >= 2:
        results["growth_percent_after_warm_up"] = growth(samples[0], samples[-1])
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
