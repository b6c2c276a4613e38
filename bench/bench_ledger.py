"""The cost of claim_next and expire_leases as finished history grows (10k, 100k, 1M rows).

Target: flat; claim p50 <= 2 ms at 1M rows; the plans use the partial indexes. Run:
    .venv/bin/python bench/bench_ledger.py [--sizes 10000,100000,1000000] [--samples 300]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402

from bench._pg import bench_database, percentile  # noqa: E402
from scrinalia.db.engine import create_engine_from_url  # noqa: E402
from scrinalia.domains.archive import ledger, registry  # noqa: E402

WORKERS = [f"worker-{i}" for i in range(8)]

GROW_HISTORY = text(
    """
    INSERT INTO archive_worker_runs
        (worker_name, status, trigger, request, queued_at, started_at, finished_at, duration_ms,
         runner_id, heartbeat_at, lease_expires_at, error)
    SELECT 'worker-' || (g % 8),
           (ARRAY['SUCCESS','FAILED','INTERRUPTED','CANCELLED']::worker_run_status[])[1 + g % 4],
           'API', '{"db_batch_size": 32}'::jsonb,
           now() - make_interval(secs => g), now() - make_interval(secs => g), now() - make_interval(secs => g - 1),
           1000, :runner, now() - make_interval(secs => g), now() - make_interval(secs => g - 60),
           CASE WHEN g % 4 = 1 THEN 'RuntimeError: failure ' || g END
      FROM generate_series(:start, :stop - 1) AS g
    """
)


def explain(engine, sql: str, params: dict) -> str:
    with engine.begin() as conn:
        plan = conn.execute(text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql), params).scalars().all()
        conn.rollback()
    return "\n".join(plan)


def measure(engine, runner_id: uuid.UUID, samples: int) -> dict:
    claims, expires = [], []
    for i in range(samples):
        worker = WORKERS[i % len(WORKERS)]
        queued = ledger.enqueue(engine, worker, {})
        t0 = time.perf_counter()
        run = ledger.claim_next(engine, runner_id, WORKERS, 60)
        claims.append((time.perf_counter() - t0) * 1000)
        assert run is not None and run.run_id == queued.run_id
        t0 = time.perf_counter()
        ledger.expire_leases(engine)
        expires.append((time.perf_counter() - t0) * 1000)
        ledger.finish(engine, run.run_id, runner_id, "SUCCESS")
    return {
        "claim_p50_ms": round(percentile(claims, 0.5), 3),
        "claim_p95_ms": round(percentile(claims, 0.95), 3),
        "expire_p50_ms": round(percentile(expires, 0.5), 3),
        "expire_p95_ms": round(percentile(expires, 0.95), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with bench_database("bench_ledger") as url:
        engine = create_engine_from_url(url, pool_size=2)
        runner_id = uuid.uuid4()
        registry.register(engine, registry.RunnerRegistration(
            runner_id=runner_id, name="bench", hostname="bench", pid=0, package_version="bench",
            schema_revision=None, capabilities=WORKERS, concurrency=1, heartbeat_seconds=15, lease_seconds=60))
        have = 0
        for size in sizes:
            with engine.begin() as conn:
                conn.execute(GROW_HISTORY, {"runner": runner_id, "start": have + 10, "stop": size + 10})
            have = size
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE archive_worker_runs"))
            row = {"history_rows": size, **measure(engine, runner_id, args.samples)}
            results.append(row)
            print(json.dumps(row), flush=True)
        # The plans at the largest size, with one QUEUED and one RUNNING row present.
        ledger.enqueue(engine, WORKERS[0], {})
        claim_sql = ledger._CLAIM_NEXT.text
        claim_plan = explain(engine, claim_sql, {"runner_id": runner_id, "capabilities": WORKERS, "lease_seconds": 60.0})
        expire_plan = explain(engine, ledger._EXPIRE_LEASES.text, {})
        engine.dispose()
    print("\nclaim_next plan:\n" + claim_plan)
    print("\nexpire_leases plan:\n" + expire_plan)
    assert "ix_worker_runs_claim" in claim_plan, "claim does not use the partial claim index"
    # Either partial index over RUNNING rows (lease or runner) keeps expiry independent of history.
    assert "Seq Scan" not in expire_plan and (
        "ix_worker_runs_lease" in expire_plan or "ix_worker_runs_runner" in expire_plan
    ), "expiry does not use a partial index over RUNNING rows"


if __name__ == "__main__":
    main()
