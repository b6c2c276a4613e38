"""CPU time per simulator seed of this checkout against another (the "before"), measured in one run.

    .venv/bin/python bench/bench_simulation_cpu.py --before PATH [--seeds 60] [--rounds 2]

``PATH`` is a copy of an older tree's ``runner/`` and ``scrinalia/`` (``git archive <commit> runner scrinalia
| tar -x -C PATH``). Each round runs ``python -m runner.simulation --seeds N --jobs 1 --json`` once on each
tree, alternating, and takes the child's CPU time (user + system, ``getrusage``), so a busy machine slows
both alike; prints the CPU seconds per seed of each and their ratio (after / before). The 2,000 seeds'
budget (3 minutes) divided by the CPU per seed says how many processes (``--jobs``) it needs.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_of(tree: Path, seeds: int) -> tuple[float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "runner.simulation", "--seeds", str(seeds), "--jobs", "1", "--json"],
                         cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True,
                         check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    totals = {"before": 0.0, "after": 0.0}
    violations = {"before": 0, "after": 0}
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", ROOT)):
            cpu, summary = cpu_of(tree, args.seeds)
            totals[name] += cpu
            violations[name] += len(summary["violations"])
    per_seed = {name: total / (args.rounds * args.seeds) for name, total in totals.items()}
    print(json.dumps({"seeds": args.seeds, "rounds": args.rounds,
                      "cpu_seconds_per_seed": {k: round(v, 4) for k, v in per_seed.items()},
                      "ratio_after_over_before": round(per_seed["after"] / per_seed["before"], 3),
                      "violations": violations,
                      "cpu_seconds_for_2000_seeds_after": round(per_seed["after"] * 2000, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
