"""Where an enqueue+claim+finish cycle's WAL goes, by relation and record type (pg_walinspect).

A fresh database at head on the bench's private cluster (``bench/_pg.py``), ``--warmup`` cycles of eight
workers, then ``--cycles`` more between two WAL positions; each WAL record of the window joined to its
relation. Records under 20 B per cycle are summed into the total only. Run:
    .venv/bin/python bench/bench_wal_by_relation.py [--warmup 2000] [--cycles 300]
"""
from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import bench_database
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger, registry

WORKERS = [f"worker-{i}" for i in range(8)]
BY_RELATION = text(
    r"""
    SELECT COALESCE(c.relname, '') AS rel, r.resource_manager, r.record_type, count(*) AS n,
           sum(r.record_length) AS bytes
      FROM pg_get_wal_records_info(CAST(:s AS pg_lsn), CAST(:e AS pg_lsn)) r
      LEFT JOIN pg_class c ON c.relfilenode = (regexp_match(r.block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid
     GROUP BY 1, 2, 3 ORDER BY 5 DESC
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    with bench_database("bench_wal_rel") as url:
        engine = create_engine_from_url(url, pool_size=2, pool_pre_ping=False)
        runner_id = uuid.uuid4()
        registry.register(engine, registry.RunnerRegistration(
            runner_id=runner_id, name="bench", hostname="bench", pid=0, package_version="bench",
            schema_revision=None, capabilities=WORKERS, concurrency=1, heartbeat_seconds=15, lease_seconds=60))

        def cycles(n: int) -> None:
            for i in range(n):
                ledger.enqueue(engine, WORKERS[i % len(WORKERS)], {})
                run = ledger.claim_next(engine, runner_id, WORKERS, 60)
                assert run is not None
                ledger.finish(engine, run.run_id, runner_id, ledger.FinishParams("SUCCESS"))

        cycles(args.warmup)
        lsn = text("SELECT pg_current_wal_insert_lsn()")
        with engine.connect() as conn:
            start = conn.execute(lsn).scalar_one()
        cycles(args.cycles)
        with engine.connect() as conn:
            end = conn.execute(lsn).scalar_one()
            rows = conn.execute(BY_RELATION, {"s": start, "e": end}).all()
        engine.dispose()
    n = args.cycles
    for r in rows:
        if r.bytes / n >= 20:
            print(f"{r.rel[:44]:44} {r.resource_manager:11} {r.record_type:14} {r.n / n:5.2f}/cycle "
                  f"{r.bytes / n:7.1f} B/cycle")
    print(f"total {sum(r.bytes for r in rows) / n:.0f} B/cycle")


if __name__ == "__main__":
    main()
