"""Reintroduce each defect of ``bench/mutants/*.patch`` on a scratch copy and let the simulator find it.

    .venv/bin/python bench/mutants/run_mutants.py [--max-seeds 2000] [--batch 100] [--jobs 2]

For each patch: copy ``runner/`` and ``scrinalia/`` to a temporary directory, apply the patch there
(``patch -p1``; the checkout is never touched), then run ``python -m runner.simulation --json`` on seeds
0, 1, 2, ... in batches until a batch reports a violation. Prints, per mutant, the first seed that broke
an invariant (so: how many seeds the simulator needed), the invariant, and the wall time. A mutant that
no seed up to ``--max-seeds`` catches exits 1. Results: docs/benchmarks.md ("The simulator's mutants").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = sorted((ROOT / "bench" / "mutants").glob("*.patch"))


def scratch_copy(patch: Path, into: Path) -> None:
    for package in ("runner", "scrinalia"):
        shutil.copytree(ROOT / package, into / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(patch)], cwd=into, check=True)


def hunt(patch: Path, max_seeds: int, batch: int, jobs: int) -> dict:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scrinalia-mutant-") as tmp:
        scratch_copy(patch, Path(tmp))
        env = dict(os.environ, PYTHONPATH=tmp)
        for first in range(0, max_seeds, batch):
            out = subprocess.run(
                [sys.executable, "-m", "runner.simulation", "--seeds", str(min(batch, max_seeds - first)),
                 "--first-seed", str(first), "--jobs", str(jobs), "--json"],
                cwd=tmp, env=env, capture_output=True, text=True, check=False,
            )
            summary = json.loads(out.stdout)
            if summary["violations"]:
                first_violation = min(summary["violations"], key=lambda v: (v["seed"], v["step"]))
                caught = {v["seed"] for v in summary["violations"]}
                return {"mutant": patch.stem, "caught": True, "first_seed": first_violation["seed"],
                        "seeds_needed": first_violation["seed"] + 1, "invariant": first_violation["invariant"],
                        "step": first_violation["step"], "seeds_caught_in_batch": len(caught),
                        "batch": [first, first + summary["seeds"]],
                        "wall_seconds": round(time.monotonic() - started, 1)}
    return {"mutant": patch.stem, "caught": False, "seeds_tried": max_seeds,
            "wall_seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seeds", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("mutants", nargs="*", help="patch files (default: every bench/mutants/*.patch)")
    args = parser.parse_args()
    patches = [Path(m) for m in args.mutants] or MUTANTS
    missed = 0
    for patch in patches:
        result = hunt(patch, args.max_seeds, args.batch, args.jobs)
        print(json.dumps(result), flush=True)
        missed += not result["caught"]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
