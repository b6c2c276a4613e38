"""The ledger's cost as finished history grows (10k, 100k, 1M rows): claim latency, WAL and statements
per enqueue+claim+finish cycle, expire_leases latency.

Targets (issue 14): claim flat (the buffers one claim touches at 1M within 2x of 10k, asserted; the
latency ratios p10/p50 printed; no plan scans the history, whichever index over the active rows the
planner picks), claim p50 <= 2 ms at 1M; WAL per cycle at 1M <= 2.2 KB; statements per cycle <= 4
(pg_stat_statements). The history is "from before migration 0003" (random UUIDv4 run ids), so new
time-ordered ids are measured against the worst index they will meet; at the largest size the cycle is
also measured once with the old default (gen_random_uuid()) for comparison, in the same run. Each cost
window starts right after a CHECKPOINT, so a page's first write in it is a full-page image, as on a
server where checkpoints come every few minutes. The engine is the runner's (no pre-ping). Run:
    .venv/bin/python bench/bench_ledger.py [--sizes 10000,100000,1000000] [--samples 300]
        [--from-revision 0019 [--rounds 3]] [--before-after ROUNDS] [--peer-python PYTHON]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from pathlib import Path

from scrinalia.domains.archive.ledger import FinishParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import ServerCost, bench_database, percentile, run_peer
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger, registry

WORKERS = [f"worker-{i}" for i in range(8)]
FLAT_RATIO_MAX = 2.0
#: The oldest revision head's statements run on (``--from-revision``): 0022's table of the runs' configurations.
OLDEST_FROM = "0022"

GROW_HISTORY = text(
    """
    INSERT INTO archive_worker_runs
        (run_id, worker_name, status, trigger, request, queued_at, started_at, finished_at, duration_ms,
         runner_id, heartbeat_at, lease_expires_at, error)
    SELECT gen_random_uuid(), 'worker-' || (g % 8),
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
        explained = text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql)
        plan = conn.execute(explained, params).scalars().all()
        conn.rollback()
    return "\n".join(plan)


def checkpoint(engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CHECKPOINT"))


def cycles(engine, runner_id: uuid.UUID, samples: int, cost: ServerCost, after_checkpoint: bool = True) -> dict:
    """``samples`` enqueue+claim+finish cycles in one cost window; claim timed. ``after_checkpoint``: the
    window starts with a CHECKPOINT (every page's first write in it is a full-page image); else it
    follows the previous window (the hot pages already imaged: a busy queue's steady state)."""
    claims = []
    if after_checkpoint:
        checkpoint(engine)
    cost.start()
    for i in range(samples):
        queued = ledger.enqueue(engine, WORKERS[i % len(WORKERS)], {})
        t0 = time.perf_counter()
        run = ledger.claim_next(engine, runner_id, WORKERS, 60)
        claims.append((time.perf_counter() - t0) * 1000)
        assert run is not None and run.run_id == queued.run_id
        ledger.finish(engine, run.run_id, runner_id, FinishParams("SUCCESS"))
    spent = cost.stop()
    out = {
        "claim_p10_ms": round(percentile(claims, 0.1), 3),
        "claim_p50_ms": round(percentile(claims, 0.5), 3),
        "claim_p95_ms": round(percentile(claims, 0.95), 3),
        "wal_bytes_per_cycle": round(spent["wal_bytes"] / samples),
    }
    if "fpi_bytes" in spent:
        out["fpi_bytes_per_cycle"] = round(spent["fpi_bytes"] / samples)
        out["fpi_per_cycle"] = round(spent["fpi_count"] / samples, 2)
    if "statements" in spent:
        out["statements_per_cycle"] = round(spent["statements"] / samples, 2)
        out["top_statements"] = spent["by_statement"][:5]
    return out


#: Migration 0016's totals trigger, which migration 0018 dropped (its function is kept until the contract
#: step): re-created for the "before" windows of ``--before-after``.
TOTALS_TRIGGER_0016 = text(
    "CREATE TRIGGER trg_archive_run_totals AFTER UPDATE OF status ON archive_worker_runs FOR EACH ROW "
    "WHEN (OLD.status IN ('QUEUED', 'RUNNING') AND NEW.status NOT IN ('QUEUED', 'RUNNING')) "
    "EXECUTE FUNCTION archive_run_totals_add()")


def before_after(engine, runner_id: uuid.UUID, samples: int, cost: ServerCost, rounds: int) -> dict:
    """Steady windows (no checkpoint before them) with 0016's per-finish totals trigger ("0017") and without
    it ("0018": the totals folded at the scrape), alternated A B B A ... in one run, so each sees the same
    load and the same state of the hot pages; the median of each side's windows."""
    sides: dict[str, list[int]] = {"0017": [], "0018": []}
    cycles(engine, runner_id, samples, cost, after_checkpoint=False)  # warm-up, discarded
    for r in range(rounds):
        order = ("0017", "0018") if r % 2 == 0 else ("0018", "0017")
        for side in order:
            with engine.begin() as conn:
                conn.execute(text("DROP TRIGGER IF EXISTS trg_archive_run_totals ON archive_worker_runs"))
                if side == "0017":
                    conn.execute(TOTALS_TRIGGER_0016)
            sides[side].append(cycles(engine, runner_id, samples, cost, after_checkpoint=False)["wal_bytes_per_cycle"])
    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS trg_archive_run_totals ON archive_worker_runs"))
    # What a scrape's fold writes instead: the runs ended before its horizon into a few totals rows.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("UPDATE archive_run_totals_watermark SET folded_before = folded_before - interval '1 day'"))
        before = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar_one()
        conn.execute(text("SELECT archive_run_totals_fold()"))
        fold_wal = conn.execute(text("SELECT pg_current_wal_insert_lsn() - CAST(:b AS pg_lsn)"),
                                {"b": before}).scalar_one()
    return {"window": f"steady, {rounds} rounds alternated",
            **{f"wal_bytes_per_cycle_{k}": sorted(v)[len(v) // 2] for k, v in sides.items()},
            **{f"windows_{k}": v for k, v in sides.items()}, "one_fold_wal_bytes": int(fold_wal)}


def upgrade_before_after(url: str, engine, runner_id: uuid.UUID, samples: int, cost: ServerCost,
                         rounds: int) -> dict:
    """Steady windows on the schema the bench started at (``--from-revision``), then ``migrate.upgrade`` to
    head on the same history and the same number of windows after one discarded window (the upgrade's
    new index takes its first pages there): the medians of each side."""
    from scrinalia.db import migrate

    def windows() -> list[int]:
        cycles(engine, runner_id, samples, cost, after_checkpoint=False)  # warm-up, discarded
        return [cycles(engine, runner_id, samples, cost, after_checkpoint=False)["wal_bytes_per_cycle"]
                for _ in range(rounds)]

    with engine.connect() as conn:
        before_revision = migrate.current_revision(conn)
    before = windows()
    migrate.upgrade(url)
    after = windows()
    return {"window": f"steady, {rounds} windows each side", "revision_before": before_revision,
            "wal_bytes_per_cycle_before": sorted(before)[len(before) // 2], "windows_before": before,
            "wal_bytes_per_cycle_head": sorted(after)[len(after) // 2], "windows_head": after}


def claim_buffers(engine, runner_id: uuid.UUID) -> int:
    """Shared buffers one claim touches (EXPLAIN ANALYZE BUFFERS, rolled back): the statement's work,
    which the machine's other jobs cannot inflate the way they inflate its latency."""
    ledger.enqueue(engine, WORKERS[0], {})
    with engine.begin() as conn:
        plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + ledger._CLAIM_NEXT.text),
                            {"runner_id": runner_id, "capabilities": WORKERS, "lease_seconds": 60.0}).scalar_one()
        conn.rollback()
    with engine.begin() as conn:  # free the slot again
        conn.execute(text("UPDATE archive_worker_runs SET status = 'CANCELLED', finished_at = now() "
                          "WHERE status = 'QUEUED'"))
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


def expiries(engine, samples: int) -> dict:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        ledger.expire_leases(engine)
        times.append((time.perf_counter() - t0) * 1000)
    return {"expire_p50_ms": round(percentile(times, 0.5), 3), "expire_p95_ms": round(percentile(times, 0.95), 3)}


def peer(url: str, python: str, history: int, samples: int) -> dict:
    """bench/peer_procrastinate.py in its own venv, against a new database of this cluster."""
    return run_peer(url, python, "peer_procrastinate.py", ["--history", str(history), "--samples", str(samples)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--peer-python", default=None,
                        help="a Python with procrastinate installed (a separate venv under /tmp): the same "
                             "cycle through Procrastinate in a database of the same cluster, same history")
    parser.add_argument("--before-after", type=int, default=0, metavar="ROUNDS",
                        help="at the largest size, ROUNDS pairs of steady windows with and without migration "
                             "0016's per-finish totals trigger, alternated (decision 0370)")
    parser.add_argument("--from-revision", default=None, metavar="REV",
                        help="start the database at migration REV, and at the largest size measure steady "
                             f"windows before and after the upgrade to head (decision 0391); {OLDEST_FROM} or "
                             "later: head's statements read that migration's table")
    parser.add_argument("--rounds", type=int, default=3, help="windows per side of --from-revision")
    args = parser.parse_args()
    if args.from_revision is not None and args.from_revision < OLDEST_FROM:
        parser.error(f"--from-revision {args.from_revision}: head's statements read the runs' configurations "
                     f"through migration {OLDEST_FROM}'s table (decision 0394); run the bench of that revision's "
                     "own code to start earlier")
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with bench_database("bench_ledger", args.from_revision or "head") as url:
        engine = create_engine_from_url(url, pool_size=2, pool_pre_ping=False)
        cost = ServerCost(engine)
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
            row = {"history_rows": size, "run_id": "uuidv7 (archive_uuid_v7)",
                   **cycles(engine, runner_id, args.samples, cost), **expiries(engine, 100),
                   "claim_buffers": claim_buffers(engine, runner_id)}
            results.append(row)
            print(json.dumps(row), flush=True)
            steady = cycles(engine, runner_id, args.samples, cost, after_checkpoint=False)
            print(json.dumps({"history_rows": size, "window": "steady (no checkpoint before it)",
                              **{k: v for k, v in steady.items() if k != "top_statements"}}), flush=True)
        if args.from_revision:
            print(json.dumps({"history_rows": have, **upgrade_before_after(url, engine, runner_id, args.samples,
                                                                           cost, args.rounds)}), flush=True)
        if args.before_after:
            print(json.dumps({"history_rows": have, **before_after(engine, runner_id, args.samples, cost,
                                                                   args.before_after)}), flush=True)
        # The same cycle with the old default (random UUIDv4 run ids), same database, same size.
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE archive_worker_runs ALTER COLUMN run_id SET DEFAULT gen_random_uuid()"))
        v4 = {"history_rows": have, "run_id": "uuidv4 (gen_random_uuid, before 0003)",
              **cycles(engine, runner_id, args.samples, cost)}
        print(json.dumps(v4), flush=True)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE archive_worker_runs ALTER COLUMN run_id SET DEFAULT archive_uuid_v7()"))
        if args.peer_python:
            print(json.dumps(peer(url, args.peer_python, have, args.samples)), flush=True)
        # The plans at the largest size, with one QUEUED and one RUNNING row present.
        ledger.enqueue(engine, WORKERS[0], {})
        claim_plan = explain(engine, ledger._CLAIM_NEXT.text,
                             {"runner_id": runner_id, "capabilities": WORKERS, "lease_seconds": 60.0})
        expire_plan = explain(engine, ledger._EXPIRE_LEASES.text, {})
        engine.dispose()
    print("\nclaim_next plan:\n" + claim_plan)
    print("\nexpire_leases plan:\n" + expire_plan)
    first, last = results[0], results[-1]
    ratios = {k: last[k] / max(first[k], 1e-9) for k in ("claim_buffers", "claim_p10_ms", "claim_p50_ms")}
    print(f"\nclaim at {last['history_rows']} / {first['history_rows']} rows: buffers {ratios['claim_buffers']:.2f}x, "
          f"p10 {ratios['claim_p10_ms']:.2f}x, p50 {ratios['claim_p50_ms']:.2f}x (flat: <= {FLAT_RATIO_MAX}x)")
    # No index name is asserted: the planner may pick any index whose range holds only active rows
    # (uq_worker_run_active, ix_worker_runs_runner, or the QUEUED range of ix_worker_runs_status_id), and
    # each keeps the cost flat. What must hold: no scan of the history, and a flat latency.
    for name, plan in (("claim", claim_plan), ("expiry", expire_plan)):
        used = sorted(set(re.findall(r"Scan (?:Backward )?using (\w+)", plan)))
        print(f"{name} reads {', '.join(used)}")
        assert "Seq Scan on archive_worker_runs" not in plan, f"{name} scans the history"
    # Flat: asserted on the claim's work (shared buffers touched), which other jobs on a shared machine
    # cannot inflate; the latency ratios (p10, p50) are printed next to it. On a quiet machine they are
    # flat too (docs/benchmarks.md); under other jobs' load they swing both ways between runs.
    assert ratios["claim_buffers"] <= FLAT_RATIO_MAX, f"claim's work is not flat: {ratios}"


if __name__ == "__main__":
    main()
