"""The batch fence's cost per batch, before and after migration 0008 (issue 9; decision 0100).

before: the old fence, ``SELECT ... FOR UPDATE`` of the run's row as the batch's first statement (held
        until COMMIT);
after:  ``ledger.register_batch_fence`` (an INSERT into the UNLOGGED ``archive_batch_fences``) as the
        first statement, checked by the deferred trigger at COMMIT (a FOR SHARE of the run's row, a
        DELETE of the fence row).

Each batch is what a document worker commits: the fence, one UPDATE stamping ``--units`` rows, COMMIT.
Both run through ``RunContext.commit``-shaped code on one pooled connection, interleaved (ABAB...), on a
PostgreSQL with its default durability (fsync on: bench/_pg.py). Statements are counted on the wire
(libpq's trace: every Query and Parse message, BEGIN and COMMIT included); time is the client's wall
clock around the whole transaction; the WAL bytes per batch come from ``pg_current_wal_lsn``.

Run:  .venv/bin/python bench/bench_fence.py [--batches 400] [--units 8]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.types import BigInteger

from bench._pg import bench_database, percentile
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger, registry
from tests.ledger.helpers import WireTrace

OLD_FENCE = text(
    """
    SELECT 1 FROM archive_worker_runs
     WHERE run_id = :run_id AND runner_id = :runner_id AND status = 'RUNNING' AND lease_expires_at > now()
       FOR UPDATE
    """
).bindparams(bindparam("run_id", type_=UUID(as_uuid=True)), bindparam("runner_id", type_=UUID(as_uuid=True)))
STAMP = text("UPDATE bench_units SET stamp = :s WHERE id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(BigInteger)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--units", type=int, default=8)
    args = parser.parse_args()
    with bench_database("fence") as url:
        engine = create_engine_from_url(url, pool_size=1)
        trace = WireTrace(engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE bench_units (id bigint PRIMARY KEY, stamp text)"))
            conn.execute(text("INSERT INTO bench_units SELECT g, NULL FROM generate_series(1, :n) g"),
                         {"n": args.units})
        runner_id = uuid.uuid4()
        registry.register(engine, registry.RunnerRegistration(
            runner_id=runner_id, name="bench", hostname="bench", pid=1, package_version="bench",
            schema_revision=None, capabilities=["w"], concurrency=1, heartbeat_seconds=15, lease_seconds=600,
            kind="daemon"))
        ledger.enqueue(engine, "w", {})
        run = ledger.claim_next(engine, runner_id, ["w"], 600)
        assert run is not None
        ids = list(range(1, args.units + 1))

        def before(i: int) -> None:
            with engine.begin() as conn:
                assert conn.execute(OLD_FENCE, {"run_id": run.run_id, "runner_id": runner_id}).first()
                conn.execute(STAMP, {"s": f"b{i}", "ids": ids})

        def after(i: int) -> None:
            with engine.begin() as conn:
                assert ledger.register_batch_fence(conn, run.run_id, runner_id)
                conn.execute(STAMP, {"s": f"a{i}", "ids": ids})

        def lsn() -> int:
            with engine.connect() as conn:
                return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())

        results: dict[str, dict[str, Any]] = {}
        for name, fn in (("before", before), ("after", after)):  # warm up, and count the statements
            fn(-1)
            mark = len(trace.statements())
            fn(-2)
            results[name] = {"statements_per_batch": len(trace.statements()) - mark,
                             "statements": trace.statements()[mark:], "ms": [], "wal_bytes": 0}
        for i in range(args.batches):
            pair = (("before", before), ("after", after))
            for name, fn in pair if i % 2 == 0 else pair[::-1]:
                start_lsn = lsn()
                t0 = time.perf_counter()
                fn(i)
                results[name]["ms"].append((time.perf_counter() - t0) * 1000)
                results[name]["wal_bytes"] += lsn() - start_lsn
        out = {}
        for name, r in results.items():
            ms = r["ms"]
            out[name] = {"statements_per_batch": r["statements_per_batch"],
                         "statements": [s[:80] for s in r["statements"]],
                         "p50_ms": round(percentile(ms, 0.5), 3), "p95_ms": round(percentile(ms, 0.95), 3),
                         "mean_ms": round(sum(ms) / len(ms), 3),
                         "wal_bytes_per_batch": round(r["wal_bytes"] / len(ms), 1)}
        with engine.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM archive_batch_fences")).scalar_one()
        out["fence_rows_left"] = left
        out["batches"] = args.batches
        out["units_per_batch"] = args.units
        engine.dispose()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
