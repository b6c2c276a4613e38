"""The run's start and end as the supervisor sees them, in one short run (issue 12's before/after).

Reuses the measurements of ``bench_live`` and ``bench_runner`` on one throwaway database:

1. pick-up latency with notifications (enqueue's commit -> the worker's first line), and its parts: the
   claim (``started_at``, written by ``record_start``) and ``metrics.child_ready_ms``;
2. child-ready latency of the preloaded fork server (claim -> the worker's code running);
3. crash-detection latency (SIGKILL of a running child -> its row FAILED).

With a standby child (decision 0341, the default) and without (``--no-standby``), in one run, alternating
sample by sample is not possible (one daemon each), so the two daemons run one after the other.

Run:  .venv/bin/python bench/bench_pickup.py [--pickup-samples 15] [--ready-samples 15] [--crash-samples 10]
      [--pickup-only] [--preload torch,transformers] [--peer-python /tmp/peers-venv/bin/python]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._pg import bench_database, percentile, run_peer
from bench.bench_live import pickup_latency
from bench.bench_runner import crash_latency, ready_latency
from scrinalia.db.engine import create_engine_from_url


def _summary(values: list[float]) -> dict[str, float]:
    return {"samples": len(values), "p50": round(percentile(values, 0.5), 1),
            "p95": round(percentile(values, 0.95), 1), "max": round(max(values), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pickup-samples", type=int, default=15)
    parser.add_argument("--ready-samples", type=int, default=15)
    parser.add_argument("--crash-samples", type=int, default=10)
    parser.add_argument("--pickup-only", action="store_true", help="only the pick-up latency")
    parser.add_argument("--preload", default="none",
                        help="the daemons' --preload (none: the fork server imports no worker library)")
    parser.add_argument("--peer-python", default=None,
                        help="a Python with procrastinate installed: its pick-up in the same run (peer_pickup.py)")
    args = parser.parse_args()
    results: dict = {"host": socket.gethostname(), "cpus": os.cpu_count(), "load": os.getloadavg()}
    with bench_database("bench_pickup") as url, tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        engine = create_engine_from_url(url)
        preload = ("--preload", args.preload)
        for label, extra in (("pickup_ms", ("--standby", *preload)),
                             ("pickup_ms_no_standby", ("--no-standby", *preload))):
            measured: Any = pickup_latency(url, engine, tmp, True, args.pickup_samples, extra)  # three lists
            first_line, claim, ready = measured
            results[label] = {**_summary(first_line), "claim_p50": round(percentile(claim, 0.5), 1),
                              "child_ready_p50": round(percentile(ready, 0.5), 1)}
        if args.peer_python:
            results["peer_pickup_ms"] = run_peer(url, args.peer_python, "peer_pickup.py",
                                                 ["--samples", str(args.pickup_samples)])
        if args.pickup_only:
            engine.dispose()
            print(json.dumps(results, indent=2))
            return
        results["child_ready_ms_forkserver"] = _summary(ready_latency(url, engine, tmp, "forkserver",
                                                                      args.ready_samples))
        results["crash_detection_ms"] = _summary(crash_latency(url, engine, tmp, args.crash_samples))
        engine.dispose()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
