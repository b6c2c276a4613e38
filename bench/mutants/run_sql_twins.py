"""Each simulator mutant of the in-memory model has a twin in the SQL, and the conformance suite catches both.

    .venv/bin/python bench/mutants/run_sql_twins.py

A mutant of ``bench/mutants/*.patch`` that patches the in-memory ledger (``runner/memory_ledger/``: the
simulator's model of PostgreSQL) is a defect the simulator finds in the model; the same defect in the
statements PostgreSQL runs is its twin, ``bench/mutants/sql/<same name>.patch`` (a patch of
``scrinalia/domains/archive/queries.sql``). For each pair: copy ``runner/``, ``scrinalia/``, ``tests/``,
``migrations/``, ``alembic.ini`` and ``pyproject.toml`` to a temporary directory (the checkout is never
touched), apply one patch there, run ``tests/ledger/test_conformance.py`` on that side only (``-k memory``
for the model's mutant, ``-k postgres`` for the SQL twin, a real PostgreSQL as the test harness finds
one; a test still waiting after 30 s fails) and list the tests that failed. Prints one JSON line per
pair; exits 1 when a mutant of the model has no SQL twin, or when either of a pair is not caught.
Results: docs/benchmarks.md ("The SQL twins").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = ROOT / "bench" / "mutants"
MODEL = "runner/memory_ledger/"
COPIED = ("runner", "scrinalia", "tests", "migrations", "alembic.ini", "pyproject.toml")
SUITE = "tests/ledger/test_conformance.py"


def model_mutants() -> list[Path]:
    return [p for p in sorted(MUTANTS.glob("*.patch")) if f"+++ b/{MODEL}" in p.read_text()]


def failed_tests(patch: Path, side: str) -> list[str]:
    """The conformance tests of ``side`` that fail with ``patch`` applied to a scratch copy."""
    with tempfile.TemporaryDirectory(prefix="scrinalia-twin-") as tmp:
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, Path(tmp) / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, Path(tmp) / name)
        subprocess.run(["patch", "-p1", "--quiet", "-i", str(patch)], cwd=tmp, check=True)
        out = subprocess.run(
            [sys.executable, "-m", "pytest", SUITE, "-v", "--tb=no", "-p", "no:cacheprovider", "--timeout", "30",
             "-k", side],
            cwd=tmp, env=dict(os.environ, PYTHONPATH=tmp), capture_output=True, text=True, check=False,
        )
    # Each test's verdict as it ends (-v); a test cut by the timeout ends the run (pytest-timeout's signal):
    # it is the last one started, and counts as caught.
    failed = set(re.findall(rf"^{re.escape(SUITE)}::(\w+)\[{side}[^\]]*\] (?:FAILED|ERROR)", out.stdout, re.M))
    started = re.findall(rf"^{re.escape(SUITE)}::(\w+)\[{side}[^\]]*\] ?$", out.stdout, re.M)
    if "INTERNALERROR" in out.stdout + out.stderr and started:
        failed.add(started[-1] + " (timed out)")
    return sorted(failed)


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    missed = 0
    for model in model_mutants():
        twin = MUTANTS / "sql" / model.name
        started = time.monotonic()
        if not twin.exists():
            print(json.dumps({"mutant": model.stem, "sql_twin": None}), flush=True)
            missed += 1
            continue
        in_memory, in_sql = failed_tests(model, "memory"), failed_tests(twin, "postgres")
        print(json.dumps({"mutant": model.stem, "model_caught_by": in_memory, "sql_twin_caught_by": in_sql,
                          "caught_by_both": sorted(set(in_memory) & set(in_sql)),
                          "wall_seconds": round(time.monotonic() - started, 1)}), flush=True)
        missed += not in_memory or not in_sql
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
