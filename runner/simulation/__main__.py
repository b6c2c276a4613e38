"""``python -m runner.simulation --seeds N [--seed S] [--json]`` (see ``runner.simulation``).

Without ``--seed``: seeds 0..N-1 over ``--jobs`` processes (default: the CPUs, at most 2 per the
project's machine), one summary; with ``--json`` one JSON object: ``seeds``, ``steps``,
``virtual_seconds``, ``faults`` (count by kind), ``violations`` (each: seed, invariant, step, ...),
``wall_seconds``. With ``--seed S``: that one history, its trace on stdout (``--json``: the summary only).
Exit status 1 when an invariant was violated.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from collections import Counter
from typing import Any

from runner.simulation.faults import FAULT_KINDS
from runner.simulation.history import SeedResult, run_seed


def _one(seed: int) -> dict[str, Any]:
    result = run_seed(seed)
    return _summary_of(result)


def _summary_of(result: SeedResult) -> dict[str, Any]:
    return {"seed": result.seed, "steps": result.steps, "virtual_seconds": result.virtual_seconds,
            "faults": dict(result.faults), "violations": [v.to_json() for v in result.violations],
            "digest": result.digest, "runs": dict(result.runs)}


def run_many(seeds: list[int], jobs: int) -> dict[str, Any]:
    started = time.monotonic()
    if jobs > 1 and len(seeds) > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_one, seeds, chunksize=max(1, min(50, len(seeds) // (jobs * 8) or 1)))
    else:
        results = [_one(seed) for seed in seeds]
    faults: Counter[str] = Counter({kind: 0 for kind in FAULT_KINDS})
    runs: Counter[str] = Counter()
    for r in results:
        faults.update(r["faults"])
        runs.update(r["runs"])
    violations = sorted((v for r in results for v in r["violations"]), key=lambda v: (v["seed"], v["step"]))
    return {
        "seeds": len(seeds),
        "steps": sum(r["steps"] for r in results),
        "virtual_seconds": round(sum(r["virtual_seconds"] for r in results), 3),
        "faults": dict(faults),
        "violations": violations,
        "runs": dict(runs),
        "wall_seconds": round(time.monotonic() - started, 3),
    }


def replay(seed: int, as_json: bool) -> int:
    def trace(at: float, who: str, what: str) -> None:
        if not as_json:
            print(f"{at:10.4f}  {who:<22} {what}")

    handler = _TraceHandler(trace)
    logger = logging.getLogger("scrinalia.runner")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    started = time.monotonic()
    try:
        result = run_seed(seed, trace=trace)
    finally:
        logger.removeHandler(handler)
    summary = _summary_of(result)
    summary["wall_seconds"] = round(time.monotonic() - started, 3)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"seed {seed}: {result.steps} steps, {result.virtual_seconds:.3f} virtual seconds, "
              f"faults {dict(result.faults)}, runs {dict(result.runs)}, digest {result.digest:08x}")
        for v in result.violations:
            print(f"VIOLATION {v.invariant} at step {v.step} ({v.at:.4f}s): {v.detail}")
    return 1 if result.violations else 0


class _TraceHandler(logging.Handler):
    """The supervisors' log lines in the trace, with the virtual time and the runner that said them."""

    def __init__(self, trace: Any) -> None:
        super().__init__(logging.INFO)
        self.trace = trace

    def emit(self, record: logging.LogRecord) -> None:
        from runner.simulation import world as world_module

        world = world_module.CURRENT
        if world is None:
            return
        who = world.current.name if world.current is not None else "world"
        self.trace(world.now, who, f"log {record.levelname.lower()}: {record.getMessage()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (0..N-1)")
    parser.add_argument("--seed", type=int, default=None, help="replay this one seed with a readable trace")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    parser.add_argument("--first-seed", type=int, default=0, help="start at this seed")
    args = parser.parse_args(argv)
    if args.seed is not None:
        return replay(args.seed, args.json)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    summary = run_many(list(range(args.first_seed, args.first_seed + args.seeds)), max(1, args.jobs))
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['seeds']} seeds, {summary['steps']} steps, {summary['virtual_seconds']:.0f} virtual seconds "
              f"in {summary['wall_seconds']:.1f} s; faults {summary['faults']}; runs {summary['runs']}")
        for v in summary["violations"]:
            print(f"VIOLATION seed {v['seed']} {v['invariant']} at step {v['step']}: {v['detail']}")
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
