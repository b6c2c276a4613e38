"""A silent partition between a runner and its database, timed (issue 9).

For each fault (``nft``: packets to and from the database port dropped on the loopback interface;
``proxy``: the runner connects through a proxy that switches to "accept bytes and never answer") and each
timing (short: --heartbeat 1 --lease 4; the defaults: 15/60), with two children running:

* fence: seconds from the partition's start to the last child's death (pidfd, wall clock);
* margin: seconds between a child's death and its row's ``lease_expires_at`` (the database's clock on
  this host): must be > 0 (dead before the lease ends);
* claim: seconds from the partition's end to the first new claim (``started_at`` of a run enqueued
  during the partition).

The partition starts at a random phase of the heartbeat. Needs root and nftables for ``nft`` (make
system-deps). Results go into docs/benchmarks.md by hand.

Run:  .venv/bin/python bench/bench_partition.py [--short-samples 3] [--default-samples 1] [--faults nft,proxy]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench._pg import bench_database
from runner import control
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from tests.runner import netfault

TIMINGS = {"short": (1.0, 4.0), "defaults": (15.0, 60.0)}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def one(kind: str, timing: str, url: str, tmp: Path, n: int) -> dict[str, float]:
    heartbeat, lease = TIMINGS[timing]
    port = int(make_url(url).port or 5432)
    engine = create_engine_from_url(url)
    admin = create_engine_from_url(url)
    proxy = None
    env = dict(os.environ, DATABASE_URL=url, SCRINALIA_WORKER_PLUGINS="tests.runner.workers:ALL",
               PYTHONPATH=str(ROOT))
    env.pop("NOTIFY_SOCKET", None)
    if kind == "proxy":
        proxy = netfault.SilentProxy("127.0.0.1", port)
        env["DATABASE_URL"] = netfault.through_proxy(url, proxy)
    observer = netfault.observer_engine(admin, url) if kind == "nft" else engine
    clock = netfault.DeathClock()
    name = f"p{kind}{timing}{n}"
    sock = tmp / f"{name}.sock"
    log = open(tmp / f"{name}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "daemon", "--name", name, "--socket", str(sock), "--preload", "none",
         "--heartbeat", str(heartbeat), "--lease", str(lease), "--poll", "0.2", "--concurrency", "2"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        runs = [ledger.enqueue(engine, w, {"options": {"units": 1_000_000, "pause": 0.1}}, requested_by="bench")
                for w in ("slow", "slow-b")]

        def pids():
            try:
                children = control.query(sock, {"command": "status"}, timeout=2)["children"]
            except (OSError, ValueError):
                return None
            found = {c["run_id"]: c["pid"] for c in children if c["phase"] == "running"}
            return found if len(found) == len(runs) else None

        children = _wait(pids, 60, "two running children")
        for pid in children.values():
            clock.watch(pid)
        time.sleep(1 + random.uniform(0, heartbeat))  # a random phase of the heartbeat
        fault = netfault.drop_port(port) if kind == "nft" else None
        if fault is not None:
            fault.__enter__()
        else:
            assert proxy is not None
            proxy.silence()
        try:
            started = time.time()
            _wait(lambda: len(clock.died) == len(children), lease + 30, "the self-fence")
            fence = max(clock.died.values()) - started
            margins = []
            for run_id, pid in children.items():
                held = ledger.get_run(observer, run_id)
                assert held is not None and held.lease_expires_at is not None
                margins.append(held.lease_expires_at.timestamp() - clock.died[pid])
            queued = ledger.enqueue(observer, "ok", {}, requested_by="bench")
            time.sleep(0.5)
        finally:
            if fault is not None:
                fault.__exit__(None, None, None)
            elif proxy is not None:
                proxy.heal()
        healed = time.time()
        def claimed() -> datetime | None:
            row = ledger.get_run(observer, queued.run_id)
            return row.started_at if row is not None else None

        claim = _wait(claimed, 60, "the first claim after the partition").timestamp() - healed
        for run in (*runs, queued):  # closed (INTERRUPTED lease-lost) before the next sample enqueues its worker again
            _wait(lambda run=run: getattr(ledger.get_run(observer, run.run_id), "status", None) != "RUNNING",
                  lease + 30, "the close")
        return {"fence_s": round(fence, 3), "min_margin_s": round(min(margins), 3), "claim_s": round(claim, 3)}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        clock.close()
        if proxy is not None:
            proxy.close()
        if observer is not engine:
            observer.dispose()
        engine.dispose()
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--short-samples", type=int, default=3)
    parser.add_argument("--default-samples", type=int, default=1)
    parser.add_argument("--faults", default="nft,proxy")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if "nft" in faults and not netfault.nft_available():
        sys.exit("nft needs root and nftables (make system-deps)")
    results: dict[str, list[dict[str, float]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-partition-"))
    with bench_database("partition") as url:
        with create_engine_from_url(url).connect() as conn:
            conn.execute(text("SELECT 1"))
        for kind in faults:
            for timing, samples in (("short", args.short_samples), ("defaults", args.default_samples)):
                for n in range(samples):
                    result = one(kind, timing, url, tmp, n)
                    results.setdefault(f"{kind} {timing}", []).append(result)
                    print(kind, timing, result, flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
