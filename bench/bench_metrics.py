"""/metrics and the crash-loop check on a big ledger, and what the run totals' trigger costs a finish.

Seeds the ledger of bench_api (1,000,000 finished runs, 100 runners, a few documents), counts the seeded
history into ``archive_run_totals`` as migration 0016 does, adds a schedule per worker with its scheduled
history, then times, on the real app in-process (ASGI, bearer session): GET /metrics (p50/p95, the
notification probe included), the collector without the probe, and the scheduler's quarantine statement.
Last, the cost of migration 0016's totals trigger on the ending statement (dropped by 0018, decision 0370:
re-created for the "on" blocks): WAL bytes and time per finish of a claim + finish cycle, with the trigger
and without, interleaved in blocks. Run:
    .venv/bin/python bench/bench_metrics.py [--runs 1000000] [--samples 100] [--finishes 500]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scrinalia.domains.archive.ledger import FinishParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import bench_database, percentile
from bench.bench_api import SEED_RUNNERS, SEED_RUNS, login
from bench.bench_ledger import TOTALS_TRIGGER_0016
from scrinalia.db.engine import create_engine_from_url

WORKERS = ("embedding", "ner", "typology", "quality-validator", "cleaning", "gpu-probe")

# The backfill of migration 0016 (the seed inserts finished rows, which the trigger does not see).
COUNT_HISTORY = text(
    """
    WITH ended AS (
        SELECT worker_name, status, CASE WHEN started_at IS NOT NULL THEN duration_ms / 1000.0 END AS seconds
          FROM archive_worker_runs WHERE status NOT IN ('QUEUED', 'RUNNING')
    ), buckets AS (
        SELECT e.worker_name, e.status, u.i, count(*) FILTER (WHERE e.seconds <= u.b) AS n
          FROM ended e CROSS JOIN unnest(archive_run_duration_bounds()) WITH ORDINALITY AS u(b, i)
         GROUP BY e.worker_name, e.status, u.i
    )
    INSERT INTO archive_run_totals (worker_name, status, runs, timed, duration_seconds_sum, duration_buckets)
    SELECT e.worker_name, e.status, count(*), count(e.seconds), COALESCE(sum(e.seconds), 0),
           (SELECT array_agg(b.n ORDER BY b.i) FROM buckets b
             WHERE b.worker_name = e.worker_name AND b.status = e.status)
      FROM ended e GROUP BY e.worker_name, e.status
    """
)


def seed(engine, n_runs: int) -> None:
    from scrinalia.db import migrate

    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(SEED_RUNNERS, {"n": 100, "revision": migrate.head_revision()})
        runner = conn.execute(text("SELECT runner_id FROM archive_worker_runners LIMIT 1")).scalar_one()
        for w in WORKERS:
            conn.execute(text("INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request) "
                              "VALUES (:w, 3600, '{}')"), {"w": w})
    step = 200_000
    for start in range(1, n_runs + 1, step):
        with engine.begin() as conn:
            conn.execute(SEED_RUNS, {"start": start, "stop": min(n_runs + 1, start + step), "runner": runner})
    with engine.begin() as conn:
        # The scheduled runs of the history belong to their worker's schedule.
        conn.execute(text("UPDATE archive_worker_runs r SET schedule_id = s.id FROM archive_worker_schedules s "
                          "WHERE r.trigger = 'SCHEDULE' AND s.worker_name = r.worker_name"))
        conn.execute(COUNT_HISTORY)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    print(f"seeded {n_runs} runs in {time.perf_counter() - t0:.1f} s", flush=True)


def stats(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 0.5), 2), "p95": round(percentile(values, 0.95), 2)}


def time_finishes(engine, n: int) -> dict[str, dict[str, float]]:
    """Claim + finish cycles of one worker, in blocks of 50 with the trigger on and off in turn."""
    import socket
    import uuid

    from scrinalia.db import migrate
    from scrinalia.domains.archive import ledger, registry

    runner = uuid.uuid4()
    registry.register(engine, registry.RunnerRegistration(
        runner_id=runner, name="bench-finish", hostname=socket.gethostname(), pid=1, package_version="bench",
        schema_revision=migrate.head_revision(), capabilities=["bench-finish"], concurrency=1,
        heartbeat_seconds=15, lease_seconds=60))
    results: dict[str, dict[str, float]] = {"trigger on": {"ms": 0.0, "wal": 0.0, "n": 0},
                                            "trigger off": {"ms": 0.0, "wal": 0.0, "n": 0}}
    lsn = text("SELECT pg_current_wal_insert_lsn()")
    diff = text("SELECT pg_wal_lsn_diff(:b, :a)")
    for block in range(max(2, n // 50)):
        label = "trigger on" if block % 2 == 0 else "trigger off"
        with engine.begin() as conn:  # migration 0018 dropped it (decision 0370): re-created for the "on" blocks
            conn.execute(text("DROP TRIGGER IF EXISTS trg_archive_run_totals ON archive_worker_runs"))
            if label == "trigger on":
                conn.execute(TOTALS_TRIGGER_0016)
        for _ in range(50):
            ledger.enqueue(engine, "bench-finish", {})
            run = ledger.claim_next(engine, runner, ["bench-finish"], 60)
            assert run is not None
            with engine.connect() as conn:
                before = conn.execute(lsn).scalar_one()
            t = time.perf_counter()
            ledger.finish(engine, run.run_id, runner, FinishParams("SUCCESS"))
            elapsed = (time.perf_counter() - t) * 1000
            with engine.connect() as conn:
                wal = conn.execute(diff, {"a": before, "b": conn.execute(lsn).scalar_one()}).scalar_one()
            results[label]["ms"] += elapsed
            results[label]["wal"] += float(wal)
            results[label]["n"] += 1
    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS trg_archive_run_totals ON archive_worker_runs"))
    return {k: {"finish_ms_mean": round(v["ms"] / v["n"], 3), "wal_bytes_per_finish": round(v["wal"] / v["n"], 1),
                "finishes": v["n"]} for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--finishes", type=int, default=500)
    args = parser.parse_args()

    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from scrinalia.api import metrics
    from scrinalia.api.app import create_app
    from scrinalia.api.settings import ApiSettings
    from scrinalia.domains.identity.users import create_user
    from scrinalia.scheduler import quarantine

    with bench_database("bench_metrics") as url:
        engine = create_engine_from_url(url, pool_size=5, max_overflow=5)
        seed(engine, args.runs)
        create_user(engine, "bench@example.org", "a bench passphrase", "ADMIN")
        app = create_app(engine=engine, api_settings=ApiSettings(cookie_secure=False), ui_dir="/nonexistent")
        with TestClient(app) as client:
            headers = login(client)
            scrape_ms, body = [], ""
            for _ in range(args.samples):
                t = time.perf_counter()
                r = client.get("/metrics", headers=headers)
                scrape_ms.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
                body = r.text
        families = list(text_string_to_metric_families(body))
        finished = sum(s.value for f in families if f.name == "scrinalia_runs_finished" for s in f.samples
                       if s.name.endswith("_total"))
        collector = metrics.LedgerCollector(engine, app.state.ctx.catalogue, probe=False)
        collect_ms, probe_ms = [], []
        for _ in range(args.samples):
            t = time.perf_counter()
            list(collector.collect())
            collect_ms.append((time.perf_counter() - t) * 1000)
            probe = metrics.probe_notification(engine)
            probe_ms.append((probe.seconds or float("nan")) * 1000)
        quarantine_ms = []
        for _ in range(args.samples):
            t = time.perf_counter()
            quarantine.quarantine_crash_loops(engine, 3)
            quarantine_ms.append((time.perf_counter() - t) * 1000)
        finishes = time_finishes(engine, args.finishes)
        engine.dispose()

    out = {
        "runs": args.runs, "samples": args.samples,
        "families": len(families), "samples_in_body": sum(len(f.samples) for f in families),
        "runs_finished_total": finished,
        "get_metrics_ms": stats(scrape_ms),
        "collector_without_probe_ms": stats(collect_ms),
        "notification_probe_ms": stats(probe_ms),
        "quarantine_statement_ms": stats(quarantine_ms),
        "finish_with_and_without_the_totals_trigger": finishes,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
