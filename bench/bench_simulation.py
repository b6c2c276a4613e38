"""The simulator's long run: 100,000+ seeds of the production Supervisor against the simulated world.

    .venv/bin/python bench/bench_simulation.py [--seeds 100000] [--jobs 2] [--chunk 2000]

Runs ``python -m runner.simulation``'s seeds in chunks (each chunk's summary printed as one JSON line,
so a long run shows its progress and a violation at once), then one total: seeds, steps, virtual
seconds, faults by kind, violations (seed, invariant, step), wall and CPU seconds, seeds per CPU-second.
Exit status 1 on any violation. ``make test`` runs 200 seeds (tests/simulation); this is the soak.
Results: docs/benchmarks.md ("The deterministic simulator").
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

from runner.simulation.__main__ import run_many


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100_000)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--chunk", type=int, default=2000)
    args = parser.parse_args()
    started, cpu0 = time.monotonic(), os.times()
    total: dict = {"seeds": 0, "steps": 0, "virtual_seconds": 0.0, "faults": Counter(), "violations": []}
    for first in range(args.first_seed, args.first_seed + args.seeds, args.chunk):
        seeds = list(range(first, min(first + args.chunk, args.first_seed + args.seeds)))
        summary = run_many(seeds, args.jobs)
        print(json.dumps({"first_seed": first, **{k: summary[k] for k in ("seeds", "steps", "wall_seconds")},
                          "violations": summary["violations"][:5]}), flush=True)
        total["seeds"] += summary["seeds"]
        total["steps"] += summary["steps"]
        total["virtual_seconds"] += summary["virtual_seconds"]
        total["faults"].update(summary["faults"])
        total["violations"] += summary["violations"]
    cpu1 = os.times()
    cpu = (cpu1.children_user + cpu1.children_system + cpu1.user + cpu1.system
           - cpu0.children_user - cpu0.children_system - cpu0.user - cpu0.system)
    total.update(faults=dict(total["faults"]), virtual_seconds=round(total["virtual_seconds"], 1),
                 wall_seconds=round(time.monotonic() - started, 1), cpu_seconds=round(cpu, 1),
                 seeds_per_cpu_second=round(total["seeds"] / max(cpu, 1e-9), 2), jobs=args.jobs,
                 load_average=os.getloadavg())
    print(json.dumps(total))
    return 1 if total["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
