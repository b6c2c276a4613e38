"""Workers for bench/bench_runner.py (SCRINALIA_WORKER_PLUGINS=bench.runner_workers:ALL)."""
from __future__ import annotations

import time

from scrinalia.domains.archive.workers.sdk import WorkerSpec


def run_noop(ctx):
    return {"noop": True}


def run_stamp(ctx):
    """Its first line takes the wall clock: bench/bench_live.py's pick-up latency ends here."""
    first_line_at = time.time()
    return {"first_line_at": first_line_at}


def run_hang(ctx):
    while True:
        time.sleep(0.1)


def _spec(name, run):
    return WorkerSpec(name=name, label=name, description=f"bench worker {name}", run=run, unit="unit",
                      accepts_extra_options=True)


ALL = [_spec("bench-noop", run_noop), _spec("bench-stamp", run_stamp), _spec("bench-hang", run_hang),
       *[_spec(f"bench-hang-{i:02d}", run_hang) for i in range(16)],
       *[_spec(f"bench-noop-{i:02d}", run_noop) for i in range(8)]]
