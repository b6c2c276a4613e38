"""Warm models against cold loads (decision 0340), in one run, on one throwaway database.

Two daemons one after the other, the same flags but ``--warm-models auto`` (the bundled model loaded once
by the fork server) and ``--warm-models none`` (every child reads it from disk, the former behaviour),
both preloading torch and transformers and serving ``embedding`` and ``typology`` (by similarity). For
each, and each worker:

1. the demo run: the 200 documents of the demo collection pending (its stamps reset), enqueue -> SUCCESS
   (the row's ``finished_at - created_at``, both PostgreSQL's clock);
2. ``--samples`` runs with 1 pending document (a new one before each): enqueue -> SUCCESS, and claim ->
   first batch started, read as ``metrics.child_ready_ms`` (claim -> the worker's code running) plus
   ``metrics.model_load`` (the engine's load: the step before the first batch);
3. memory: the fork server's RSS (``/proc/PID/status``) once ready, and, sampled while the demo run's
   child works, that child's RSS, PSS and USS (Private_Clean + Private_Dirty of
   ``/proc/PID/smaps_rollup``): with a warm model the weights are the fork server's pages, shared.

Run:  .venv/bin/python bench/bench_warm.py [--samples 8]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text

from bench._pg import bench_database, percentile
from bench.bench_runner import Daemon, _wait_row
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.demo import load_demo_collection
from scrinalia.domains.archive.workers.stamps import reset_stamps

WORKERS = ("embedding", "typology")
MIB = 2 ** 20


def smaps_rollup(pid: int) -> dict[str, int] | None:
    """RSS, PSS and USS (private pages) of a process, in bytes; None once it is gone."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except OSError:
        return None
    return {"rss": fields.get("Rss", 0), "pss": fields.get("Pss", 0),
            "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)}


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class ChildMemory:
    """Samples the running children's smaps_rollup every 50 ms; keeps each child's largest RSS sample."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.samples: dict[int, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                children = self.daemon.status()["children"]
            except (OSError, ValueError):
                children = []
            for child in children:
                if child.get("phase") != "running":
                    continue
                got = smaps_rollup(child["pid"])
                if got and got["rss"] > self.samples.get(child["pid"], {}).get("rss", 0):
                    self.samples[child["pid"]] = got
            self._stop.wait(0.05)

    def stop(self) -> dict[str, float] | None:
        self._stop.set()
        self._thread.join()
        if not self.samples:
            return None
        biggest = max(self.samples.values(), key=lambda s: s["rss"])
        return {k: round(v / MIB, 1) for k, v in biggest.items()}


def _run(engine: Any, worker: str) -> Any:
    run = ledger.enqueue(engine, worker, {"preset": "cpu"}, requested_by="bench")
    row = _wait_row(engine, run.run_id, ("SUCCESS", "FAILED"), timeout=600)
    assert row.status == "SUCCESS", row.error
    return row


def _seconds(row: Any) -> float:
    return (row.finished_at - row.created_at).total_seconds()


def _first_batch_ms(row: Any) -> float:
    loads = row.metrics.get("model_load") or []
    return row.metrics["child_ready_ms"] + sum(load["seconds"] for load in loads) * 1000


def _mode(url: str, engine: Any, tmp: Path, mode: str, samples: int) -> dict[str, Any]:
    daemon = Daemon(url, tmp, f"warm-{mode}", "--preload", "torch,transformers", "--capabilities",
                    ",".join(WORKERS), "--warm-models", "auto" if mode == "warm" else "none")
    out: dict[str, Any] = {}
    try:
        launcher = daemon.status()["launcher"]
        out["fork_server_rss_mib"] = round(rss(launcher["pid"]) / MIB, 1)
        out["warm_model_mib"] = round((launcher.get("warm") or {}).get("bytes", 0) / MIB, 1)
        for worker in WORKERS:
            reset_stamps(engine, worker)
            memory = ChildMemory(daemon)
            demo = _run(engine, worker)
            child = memory.stop()
            singles = []
            for i in range(samples):
                with engine.begin() as conn:
                    conn.execute(text("INSERT INTO archive_documents (reference_code, title, status) VALUES "
                                      "(:r, :t, 'DRAFT')"),
                                 {"r": f"BENCH/{mode}/{worker}/{i}", "t": f"Letter {i} of the chapter to the bishop"})
                singles.append(_run(engine, worker))
            one = [_seconds(r) * 1000 for r in singles]
            first = [_first_batch_ms(r) for r in singles]
            out[worker] = {
                "demo_units": demo.result.get("units"),
                "demo_seconds": round(_seconds(demo), 2),
                "demo_model_load": demo.metrics.get("model_load"),
                "demo_child_mib": child,
                "one_doc_ms_p50": round(percentile(one, 0.5), 1),
                "one_doc_ms_p95": round(percentile(one, 0.95), 1),
                "first_batch_ms_p50": round(percentile(first, 0.5), 1),
                "first_batch_ms_p95": round(percentile(first, 0.95), 1),
                "loads_warm": sum(all(x["warm"] for x in r.metrics.get("model_load") or [{"warm": False}])
                                  for r in singles),
            }
            print(f"{mode} {worker}: {json.dumps(out[worker])}", file=sys.stderr, flush=True)
    finally:
        daemon.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    results: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "load": os.getloadavg()}
    with bench_database("bench_warm") as url, tempfile.TemporaryDirectory() as tmpdir:
        engine = create_engine_from_url(url)
        results["demo_documents"] = load_demo_collection(engine)
        for mode in ("warm", "cold"):
            results[mode] = _mode(url, engine, Path(tmpdir), mode, args.samples)
        engine.dispose()
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
