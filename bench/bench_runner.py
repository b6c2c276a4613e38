"""The runner's process model, measured on real processes and a real PostgreSQL.

1. Child-ready latency, from the claim to the worker's code running (``metrics.child_ready_ms``, both
   ends on CLOCK_MONOTONIC): the preloaded fork server against plain spawn, side by side, both with
   torch and transformers (the fork server preloads them; a spawned child imports them, as a real
   worker would). Target: fork server p50 <= 100 ms.
2. Crash-detection latency: SIGKILL of a running child -> its row FAILED (``finished_at`` minus the
   database's clock_timestamp() read just before the kill). Target p50 <= 500 ms.
3. Heartbeat cost: SQL statements per heartbeat tick at concurrency 1, 4 and 16 (counted on the
   supervisor's own engine with SQLAlchemy's before_cursor_execute event). Target: 1 at every level.

Run:  .venv/bin/python bench/bench_runner.py [--ready-samples 30] [--spawn-samples 10] [--crash-samples 30]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import event, text

from bench._pg import bench_database, percentile
from runner import control
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger

PLUGINS = "bench.runner_workers:ALL"


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DATABASE_URL=url, SCRINALIA_WORKER_PLUGINS=PLUGINS, PYTHONPATH=str(ROOT))
    env.pop("NOTIFY_SOCKET", None)
    return env


FAST = ("--heartbeat", "1", "--lease", "10", "--poll", "0.05")


class Daemon:
    """A ``scrinalia-runner daemon``; ``timing`` replaces the bench's fast heartbeat/lease/poll (an empty
    tuple: the defaults)."""

    def __init__(self, url: str, tmp: Path, name: str, *flags: str, timing: tuple[str, ...] = FAST,
                 wait: bool = True) -> None:
        self.sock = tmp / f"{name}.sock"
        self.log = open(tmp / f"{name}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "daemon", "--name", name, "--socket", str(self.sock),
             *timing, *flags],
            cwd=ROOT, env=_env(url), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                self.status()
                return
            except (OSError, ValueError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {self.sock.stem} did not start") from None
                time.sleep(0.05)

    def status(self):
        return control.query(self.sock, {"command": "status"}, timeout=5)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def _wait_row(engine, run_id, statuses, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        row = ledger.get_run(engine, run_id)
        assert row is not None, run_id
        if row.status in statuses:
            return row
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} stuck in {row.status}")
        time.sleep(0.01)


def ready_latency(url, engine, tmp, method, samples):
    daemon = Daemon(url, tmp, f"ready-{method}", "--start-method", method, "--preload", "torch,transformers",
                    "--capabilities", "bench-noop")
    try:
        values = []
        for _ in range(samples + 1):
            run = ledger.enqueue(engine, "bench-noop", {})
            row = _wait_row(engine, run.run_id, ("SUCCESS", "FAILED"))
            assert row.status == "SUCCESS", row.error
            values.append(row.metrics["child_ready_ms"])
        return values[1:]  # the first one warms the database's caches
    finally:
        daemon.stop()


def crash_latency(url, engine, tmp, samples):
    daemon = Daemon(url, tmp, "crash", "--preload", "torch,transformers", "--capabilities", "bench-hang")
    try:
        values = []
        for _ in range(samples):
            run = ledger.enqueue(engine, "bench-hang", {})
            deadline = time.monotonic() + 60
            pid = None
            while pid is None:
                for child in daemon.status()["children"]:
                    if child["run_id"] == str(run.run_id) and child["phase"] == "running":
                        pid = child["pid"]
                if time.monotonic() > deadline:
                    raise RuntimeError("no running child")
                time.sleep(0.01)
            with engine.connect() as conn:
                before = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
            os.kill(pid, signal.SIGKILL)
            row = _wait_row(engine, run.run_id, ("FAILED",))
            values.append((row.finished_at - before).total_seconds() * 1000)
        return values
    finally:
        daemon.stop()


def heartbeat_cost(url, concurrency, ticks):
    """An in-process supervisor (this process never imports torch either), driven tick by tick."""
    from runner.database import child_connect_args, parent_engine, registration
    from runner.forkserver import ForkServerLauncher
    from runner.loop_state import ChildSetup
    from runner.options import RunnerOptions
    from runner.ports import Host
    from runner.supervisor import Supervisor

    os.environ["SCRINALIA_WORKER_PLUGINS"] = PLUGINS
    os.environ["PYTHONPATH"] = str(ROOT)
    workers = [f"bench-hang-{i:02d}" for i in range(concurrency)]
    options = RunnerOptions(name=f"hb-{concurrency}", concurrency=concurrency, heartbeat_seconds=0.25,
                            lease_seconds=10, poll_seconds=0.05, drain_timeout=0, kill_grace=0.5,
                            preload=()).validate()
    engine = parent_engine(url, options)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cur, stmt, *a: statements.append(stmt))
    beats: list[tuple[int, int]] = []  # (statements in this tick's heartbeat call, rows renewed)
    def counted(*args, **kwargs):
        before = len(statements)
        result = original(*args, **kwargs)
        beats.append((len(statements) - before, len(result.held)))
        return result

    sup = Supervisor(options, registration(options, workers, kind="daemon", schema_revision=None),
                     ForkServerLauncher(()), ChildSetup(url, child_connect_args(None), engine=engine),
                     host=Host(install_signals=False))
    port = cast(Any, sup.db.ledger)
    original = port.heartbeat
    port.heartbeat = counted  # the port's statement, counted (the SQL is the ledger module's)
    try:
        sup.open()
        for worker in workers:
            ledger.enqueue(engine, worker, {})
        sup.heartbeat.beat()
        deadline = time.monotonic() + 120
        while sum(1 for c in sup.children.values() if c.phase == "running") < concurrency:
            sup.tick()
            if time.monotonic() > deadline:
                raise RuntimeError("children did not start")
        beats.clear()
        start = len(statements)
        while len(beats) < ticks:
            sup.tick()
        window = statements[start:]
        sup.drain.stop_now("bench done")
        while not sup._done():
            sup.tick()
    finally:
        port.heartbeat = original
        sup.close()
        engine.dispose()
    per_tick = sorted({n for n, _ in beats})
    renewed = sorted({r for _, r in beats})
    kinds: dict[str, int] = {}
    for stmt in window:
        kind = ("heartbeat" if "WITH registry AS" in stmt else "expire_leases" if "lease-lost" in stmt
                else "claim_next" if "FOR UPDATE SKIP LOCKED" in stmt else stmt.split()[0].lower())
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"concurrency": concurrency, "ticks": len(beats), "statements_per_heartbeat": per_tick,
            "rows_renewed_per_heartbeat": renewed, "statements_in_window_by_kind": kinds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-samples", type=int, default=30)
    parser.add_argument("--spawn-samples", type=int, default=10)
    parser.add_argument("--crash-samples", type=int, default=30)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    results: dict = {"host": socket.gethostname(), "cpus": os.cpu_count()}
    with bench_database("bench_runner") as url, tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        engine = create_engine_from_url(url)
        fork = ready_latency(url, engine, tmp, "forkserver", args.ready_samples)
        spawn = ready_latency(url, engine, tmp, "spawn", args.spawn_samples)
        results["child_ready_ms"] = {
            name: {"samples": len(v), "p50": round(percentile(v, 0.5), 1), "p95": round(percentile(v, 0.95), 1),
                   "min": round(min(v), 1), "max": round(max(v), 1)}
            for name, v in (("forkserver+preload", fork), ("spawn", spawn))
        }
        crash = crash_latency(url, engine, tmp, args.crash_samples)
        results["crash_detection_ms"] = {"samples": len(crash), "p50": round(percentile(crash, 0.5), 1),
                                         "p95": round(percentile(crash, 0.95), 1), "max": round(max(crash), 1)}
        results["heartbeat"] = [heartbeat_cost(url, n, args.ticks) for n in (1, 4, 16)]
        engine.dispose()
    results["targets"] = {
        "ready_p50_le_100ms": results["child_ready_ms"]["forkserver+preload"]["p50"] <= 100,
        "crash_p50_le_500ms": results["crash_detection_ms"]["p50"] <= 500,
        "one_statement_per_heartbeat": all(h["statements_per_heartbeat"] == [1] for h in results["heartbeat"]),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
