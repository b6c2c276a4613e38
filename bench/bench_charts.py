"""The panel's charts: what storing a run's samples costs, and how fast the chart queries are on 1M runs.

1. Cost per run (decision 0160): four runs of one runner live through ``--seconds`` of real time at the
   supervisor's cadence (one ``record_progress`` for all children every 0.5 s, a heartbeat with the
   children snapshot every 15 s), from enqueue to finish. WAL bytes (LSN delta, full-page images with
   pg_walinspect) and statements (pg_stat_statements) per run, with migration 0015's triggers and indexes
   ("after"), then with the triggers disabled and the two indexes dropped ("before"), in one run. Each
   window starts after a CHECKPOINT.
2. On a ledger of ``--runs`` finished runs (bench_api's year of history: one run every 31.5 s, six
   workers, all on one runner: the worst case for its slots chart) and ``--samples-rows`` samples, plus one
   run of 24 h with its samples at the 2-s spacing and the heartbeat's: each chart query timed
   ``--repeat`` times (p50, p95), the statement alone and through the API in-process (session included),
   with its plan, the calls of the chart queries in turns. Target (issue 22): p50 <= 50 ms each. The
   runner's chart is also timed with its first statement (``RUNNER_SLOTS_BEFORE``, "before"), and the
   two compared bucket by bucket in one transaction. And the prune: one bounded statement's time with
   a backlog of old samples, and with nothing to prune (what each scheduler tick pays).
Run:
    .venv/bin/python bench/bench_charts.py [--runs 1000000] [--samples-rows 1000000] [--seconds 60] [--repeat 100]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from scrinalia.domains.archive.ledger import FinishParams, StartParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.types import Interval

from bench._pg import ServerCost, bench_database, percentile
from bench.bench_api import SEED_RUNNERS, SEED_RUNS
from scrinalia.db.engine import create_engine_from_url, one_statement
from scrinalia.domains.archive import charts, ledger, registry

PROGRESS_INTERVAL = 0.5  # runner.loop_state.PROGRESS_INTERVAL (the bench does not import the runner)
HEARTBEAT_SECONDS = 15.0
TARGET_MS = 50.0


def checkpoint(engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CHECKPOINT"))


def register(engine, capabilities: list[str]) -> uuid.UUID:
    from scrinalia.db import migrate

    runner_id = uuid.uuid4()
    registry.register(engine, registry.RunnerRegistration(
        runner_id=runner_id, name=f"bench-{runner_id.hex[:6]}", hostname="bench", pid=1, package_version="bench",
        schema_revision=migrate.head_revision(), capabilities=capabilities, concurrency=len(capabilities),
        heartbeat_seconds=HEARTBEAT_SECONDS, lease_seconds=60, kind="daemon"))
    return runner_id


#: The relations of the ledger: what the runs' own writes touch (the rest of a window's WAL is the
#: cluster's: autovacuum, analyze, the catalogue).
LEDGER_WAL = text(
    """
    SELECT c.relname, sum(w.record_length) AS bytes
      FROM (SELECT record_length, substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)') AS rel
              FROM pg_get_wal_records_info(CAST(:a AS pg_lsn), CAST(:b AS pg_lsn))) AS w
      JOIN pg_class AS c ON c.relfilenode::text = w.rel
     WHERE c.relname LIKE 'archive_worker_run%' OR c.relname LIKE 'ix_worker_runs%'
        OR c.relname LIKE 'ix_run_samples%' OR c.relname = 'uq_worker_run_active'
     GROUP BY 1 ORDER BY 2 DESC
    """
)


def lsn(engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())


def ledger_wal(engine, start: str, end: str) -> dict[str, int]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("SELECT pg_switch_wal()"))  # flushes it, so pg_walinspect may read the window
        return {r.relname: int(r.bytes) for r in conn.execute(LEDGER_WAL, {"a": start, "b": end})}


def live_runs(engine, seconds: float, cost: ServerCost, n_children: int = 4) -> dict:
    """``n_children`` runs from enqueue to finish through ``seconds`` of the supervisor's cadence."""
    workers = [f"cost-{uuid.uuid4().hex[:6]}" for _ in range(n_children)]
    runner = register(engine, workers)
    checkpoint(engine)
    cost.start()
    start = lsn(engine)
    runs = []
    for w in workers:
        ledger.enqueue(engine, w, {})
        run = ledger.claim_next(engine, runner, [w], 60)
        assert run is not None
        ledger.record_start(engine, run.run_id, runner, StartParams(None, None, {}, {}))
        runs.append(run)
    t0 = time.monotonic()
    next_beat = t0
    tick = 0
    while time.monotonic() - t0 < seconds:
        tick += 1
        progress = {r.run_id: {"done": tick * 8, "total": 100_000, "unit": "document"} for r in runs}
        ledger.record_progress(engine, runner, progress)
        if time.monotonic() >= next_beat:
            children = [{"pid": 1000 + i, "run_id": str(r.run_id), "worker": r.worker_name, "phase": "running",
                         "elapsed_seconds": round(time.monotonic() - t0, 3), "progress": progress[r.run_id],
                         "rss_bytes": 2_000_000_000 + tick * 4096, "gpu_memory_bytes": 30_000_000_000,
                         "device": None, "cancel_requested": False} for i, r in enumerate(runs)]
            ledger.heartbeat(engine, runner, 60, progress=progress, children=children)
            next_beat += HEARTBEAT_SECONDS
        time.sleep(max(0.0, t0 + tick * PROGRESS_INTERVAL - time.monotonic()))
    for r in runs:
        ledger.finish(engine, r.run_id, runner, FinishParams("SUCCESS", progress={"done": tick * 8, "total": 100_000}))
    end = lsn(engine)
    spent = cost.stop()
    registry.stop(engine, runner)
    try:
        by_relation = ledger_wal(engine, start, end)
        spent["ledger_wal_by_relation"] = by_relation
        spent["ledger_wal_bytes"] = sum(by_relation.values())
    except Exception as exc:  # no pg_walinspect on BENCH_DATABASE_URL's server
        spent["ledger_wal_bytes"] = None
        print(f"no per-relation WAL: {exc}", flush=True)
    with engine.connect() as conn:
        samples = conn.execute(text("SELECT count(*) FROM archive_worker_run_samples WHERE run_id = ANY(:ids)"),
                               {"ids": [r.run_id for r in runs]}).scalar_one()
    spent["runs"] = n_children
    spent["progress_statements"] = tick
    spent["samples"] = int(samples)
    return spent


def without_charts(engine) -> None:
    """The schema as before migration 0015, for the "before" window: no sample triggers, no chart indexes."""
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE archive_worker_runs DISABLE TRIGGER trg_worker_runs_sample_progress"))
        conn.execute(text("ALTER TABLE archive_worker_runners DISABLE TRIGGER trg_worker_runners_sample_children"))
        conn.execute(text("DROP INDEX ix_worker_runs_worker_finished"))
        conn.execute(text("DROP INDEX ix_worker_runs_runner_finished"))


def with_charts(engine) -> None:
    """Migration 0015's triggers and indexes back, for what follows the "before" window."""
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE archive_worker_runs ENABLE TRIGGER trg_worker_runs_sample_progress"))
        conn.execute(text("ALTER TABLE archive_worker_runners ENABLE TRIGGER trg_worker_runners_sample_children"))
        conn.execute(text("CREATE INDEX ix_worker_runs_worker_finished ON archive_worker_runs (worker_name, "
                          "finished_at) INCLUDE (status, duration_ms) WHERE finished_at IS NOT NULL"))
        conn.execute(text("CREATE INDEX ix_worker_runs_runner_finished ON archive_worker_runs (runner_id, "
                          "finished_at) INCLUDE (started_at) WHERE finished_at IS NOT NULL AND runner_id IS NOT NULL"))


def cost_per_run(url: str, seconds: float) -> dict:
    engine = create_engine_from_url(url, pool_size=2, max_overflow=2)
    cost = ServerCost(engine)
    out = {}
    try:
        live_runs(engine, min(seconds, 10.0), cost)  # warm-up, not counted: the catalogue's first reads
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        out["after"] = live_runs(engine, seconds, cost)
        without_charts(engine)
        out["before"] = live_runs(engine, seconds, cost)
        with_charts(engine)
    finally:
        engine.dispose()
    for label in ("after", "before"):
        s = out[label]
        s["wal_bytes_per_run"] = round(s["wal_bytes"] / s["runs"])
        if s.get("ledger_wal_bytes") is not None:
            s["ledger_wal_bytes_per_run"] = round(s["ledger_wal_bytes"] / s["runs"])
        s["samples_per_run"] = s["samples"] / s["runs"]
        for noisy in ("wal_by_relation", "by_statement"):
            s.pop(noisy, None)
        if "statements" in s:
            s["statements_per_run"] = round(s["statements"] / s["runs"], 1)
    return out


# --- the chart queries on a big ledger ----------------------------------------------------------

SEED_SAMPLES = text(
    """
    INSERT INTO archive_worker_run_samples (run_id, at, done, total, rss_bytes, gpu_bytes)
    SELECT r.run_id, r.started_at + make_interval(secs => 2 * k), 100 * k, 1500,
           CASE WHEN k % 8 = 0 THEN 2000000000 + k END, NULL
      FROM (SELECT run_id, started_at FROM archive_worker_runs ORDER BY id DESC LIMIT :runs) AS r,
           generate_series(1, 15) AS k
    """
)

# One run of 24 h with the samples the triggers keep (migration 0015): progress every 2 s for its first
# 600 s, then at age/300; memory every 15 s (the heartbeat) for 4,500 s, then at age/300.
SEED_LONG_RUN = text(
    """
    WITH run AS (
        INSERT INTO archive_worker_runs (worker_name, status, trigger, request, started_at, runner_id,
                                         heartbeat_at, lease_expires_at, progress)
        VALUES ('embedding', 'RUNNING', 'API', '{}', now() - interval '24 hours', :runner, now(),
                now() + interval '60 seconds', '{"done": 43200, "total": 50000, "unit": "document"}')
        RETURNING run_id, started_at),
    progress AS (
        SELECT 2.0 * k AS age FROM generate_series(1, 300) AS k
        UNION ALL
        SELECT 600 * power(1 + 1 / 300.0, k) FROM generate_series(1, 1493) AS k),
    memory AS (
        SELECT 15.0 * k AS age FROM generate_series(1, 300) AS k
        UNION ALL
        SELECT 4500 * power(1 + 1 / 300.0, k) FROM generate_series(1, 888) AS k)
    INSERT INTO archive_worker_run_samples (run_id, at, done, total, rss_bytes, gpu_bytes)
    SELECT run.run_id, run.started_at + make_interval(secs => age), (age / 2)::bigint, 50000, NULL, NULL
      FROM run, progress
    UNION ALL
    SELECT run.run_id, run.started_at + make_interval(secs => age), (age / 2)::bigint, 50000,
           3000000000 + (age * 1000)::bigint, 40000000000
      FROM run, memory
    RETURNING run_id
    """
)

# Samples of runs from a month ago: what the prune finds when it has a backlog.
SEED_OLD_SAMPLES = text(
    """
    INSERT INTO archive_worker_run_samples (run_id, at, done)
    SELECT encode(substring(int8send((extract(epoch FROM now() - interval '30 days') * 1000)::bigint + g / 100)
                  FROM 3) || substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid,
           now() - interval '30 days', g
      FROM generate_series(1, :n) AS g
    """
)


def seed(engine, n_runs: int, n_samples: int) -> tuple[uuid.UUID, uuid.UUID]:
    from scrinalia.db import migrate

    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(SEED_RUNNERS, {"n": 10, "revision": migrate.head_revision()})
        runner = conn.execute(text("SELECT runner_id FROM archive_worker_runners ORDER BY name LIMIT 1")).scalar_one()
    step = 200_000
    for start in range(1, n_runs + 1, step):
        with engine.begin() as conn:
            conn.execute(SEED_RUNS, {"start": start, "stop": min(n_runs + 1, start + step), "runner": runner})
    with engine.begin() as conn:
        conn.execute(SEED_SAMPLES, {"runs": n_samples // 15})
        long_run = conn.execute(SEED_LONG_RUN, {"runner": runner}).scalars().first()
        conn.execute(SEED_OLD_SAMPLES, {"n": 50_000})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
        total = conn.execute(text("SELECT count(*) FROM archive_worker_run_samples")).scalar_one()
    print(f"seeded {n_runs} runs and {total} samples in {time.perf_counter() - t0:.1f} s", flush=True)
    return runner, long_run


# The runner's chart as it was first written (the "before" of its rewrite): the same windows and
# result, by timestamp and interval arithmetic per run, and a series of buckets per run spanning several.
RUNNER_SLOTS_BEFORE = text(
    f"""
    WITH w AS (SELECT {charts._SINCE} AS since),
    spans AS (
        SELECT r.started_at AS s, r.finished_at AS f
          FROM archive_worker_runs AS r
         WHERE r.runner_id = :runner_id AND r.finished_at IS NOT NULL
           AND r.finished_at >= {charts._SINCE} AND r.started_at IS NOT NULL
        UNION ALL
        SELECT r.started_at, now()
          FROM archive_worker_runs AS r
         WHERE r.runner_id = :runner_id AND r.status = 'RUNNING' AND r.started_at IS NOT NULL
    ),
    parts AS (
        -- each run's part in the bucket of its finish; a run that began in an earlier bucket also has
        -- whole or partial earlier buckets (most runs are shorter than a bucket: no series for them)
        SELECT date_bin(:step, sp.f, {charts._ORIGIN}) AS bf, GREATEST(sp.s, w.since) AS s, sp.f
          FROM spans AS sp, w
         WHERE sp.f > sp.s
    ),
    busy AS (
        SELECT bucket, sum(span) AS span FROM (
            SELECT bf AS bucket, f - GREATEST(s, bf) AS span FROM parts
            UNION ALL
            SELECT g.bucket, LEAST(p.bf, g.bucket + :step) - GREATEST(p.s, g.bucket)
              FROM parts AS p,
                   LATERAL generate_series(date_bin(:step, p.s, {charts._ORIGIN}), p.bf - :step, :step) AS g(bucket)
             WHERE p.s < p.bf
        ) AS pieces
         GROUP BY 1
    )
    SELECT date_part('epoch', b.bucket)::float8 AS epoch,
           COALESCE(date_part('epoch', busy.span), 0)::float8
             / date_part('epoch', CAST(:step AS interval))::float8 AS busy,
           (SELECT concurrency FROM archive_worker_runners WHERE runner_id = :runner_id) AS concurrency,
           w.since, now() AS until
      FROM w
     CROSS JOIN generate_series(w.since, now(), :step) AS b(bucket)
      LEFT JOIN busy ON busy.bucket = b.bucket
     ORDER BY b.bucket
    """
).bindparams(bindparam("runner_id", type_=UUID(as_uuid=True)), bindparam("step", type_=Interval()),
             bindparam("span", type_=Interval()))


def runner_slots_before(engine, runner: uuid.UUID, window: charts.Window) -> list[dict]:
    """What ``charts.runner_slots`` returned with the "before" statement (the same rounding)."""
    with one_statement(engine) as conn:
        rows = conn.execute(RUNNER_SLOTS_BEFORE, {"runner_id": runner, "step": window.step,
                                                  "span": window.span}).all()
    return [{"t": r.epoch, "busy": round(r.busy, 3)} for r in rows]


def slots_agree(engine, runner: uuid.UUID) -> dict:
    """Before and after in one transaction (one ``now()``): the largest difference of a bucket's busy slots."""
    out = {}
    for name, window in charts.RUNNER_WINDOWS.items():
        params = {"runner_id": runner, "step": window.step, "span": window.span}
        with engine.begin() as conn:
            before = conn.execute(RUNNER_SLOTS_BEFORE, params).all()
            after = conn.execute(charts._RUNNER_SLOTS, params).all()
        assert [r.epoch for r in before] == [r.epoch for r in after], name
        out[name] = {"buckets": len(after),
                     "busy_slot_seconds": round(sum(r.busy for r in after) * window.step.total_seconds()),
                     "max_abs_diff": max(abs(x.busy - y.busy) for x, y in zip(before, after, strict=True))}
    return out


BARE_READ = text(
    """
    SELECT count(*), sum(finished_at - started_at) FROM archive_worker_runs
     WHERE runner_id = :r AND finished_at IS NOT NULL AND finished_at >= now() - interval '7 days'
    """
)


def bare_read(engine, runner: uuid.UUID) -> None:
    with engine.connect() as conn:
        conn.execute(BARE_READ, {"r": runner}).one()


def timed(fn, repeat: int) -> dict:
    for _ in range(5):
        fn()
    ms = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1000)
    return {"p50_ms": round(percentile(ms, 0.5), 2), "p95_ms": round(percentile(ms, 0.95), 2)}


def timed_interleaved(fns: dict, repeat: int) -> dict:
    """``timed`` for several, in turns: each sees the same load on a shared machine."""
    for _ in range(5):
        for fn in fns.values():
            fn()
    ms: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            ms[name].append((time.perf_counter() - t) * 1000)
    return {name: {"p50_ms": round(percentile(v, 0.5), 2), "p95_ms": round(percentile(v, 0.95), 2)}
            for name, v in ms.items()}


def plan(engine, statement, params: dict) -> str:
    with engine.begin() as conn:
        rows = conn.execute(text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + str(statement)),
                            params).scalars().all()
        conn.rollback()
    return "\n".join(rows)


def query_times(url: str, n_runs: int, n_samples: int, repeat: int) -> dict:
    from fastapi.testclient import TestClient

    from scrinalia.api.app import create_app
    from scrinalia.api.settings import ApiSettings
    from scrinalia.domains.identity.users import create_user

    engine = create_engine_from_url(url, pool_size=4, max_overflow=4)
    out: dict = {}
    try:
        runner, long_run = seed(engine, n_runs, n_samples)
        create_user(engine, "bench@example.org", "a bench passphrase", "ADMIN")
        day, week = charts.WINDOWS["24h"], charts.WINDOWS["7d"]
        rday, rweek = charts.RUNNER_WINDOWS["24h"], charts.RUNNER_WINDOWS["7d"]
        with engine.connect() as conn:
            in_week = conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE worker_name = 'embedding' "
                                        "AND finished_at >= now() - interval '7 days'")).scalar_one()
        out["ledger"] = {"runs": n_runs, "embedding_runs_in_7d": in_week,
                         "runner_runs_in_7d": in_week * 6}
        queries = {
            "worker 24h": lambda: charts.worker_trend(engine, "embedding", day),
            "worker 7d": lambda: charts.worker_trend(engine, "embedding", week),
            "runner 24h": lambda: charts.runner_slots(engine, runner, rday),
            "runner 24h, before": lambda: runner_slots_before(engine, runner, rday),
            "runner 7d": lambda: charts.runner_slots(engine, runner, rweek),
            "runner 7d, before": lambda: runner_slots_before(engine, runner, rweek),
            "run of 24 h": lambda: charts.run_series(engine, long_run, 300),
            # What the runner's 7-d chart cannot do without: reading its runs of the window (a baseline)
            "baseline: read the runner's 7 d of runs": lambda: bare_read(engine, runner),
        }
        out["statement"] = timed_interleaved(queries, repeat)
        out["runner_slots_before_vs_after"] = slots_agree(engine, runner)
        app = create_app(engine=engine, api_settings=ApiSettings(cookie_secure=False), ui_dir="/nonexistent")
        with TestClient(app) as client:
            token = client.post("/api/v1/auth/login", json={"email": "bench@example.org",
                                                            "password": "a bench passphrase",
                                                            "issue_token": True}).json()["token"]
            headers = {"Authorization": f"Bearer {token}"}
            routes = {
                "worker 24h": "/api/v1/system/charts/workers/embedding?window=24h",
                "worker 7d": "/api/v1/system/charts/workers/embedding?window=7d",
                "runner 24h": f"/api/v1/system/charts/runners/{runner}?window=24h",
                "runner 7d": f"/api/v1/system/charts/runners/{runner}?window=7d",
                "run of 24 h": f"/api/v1/system/charts/runs/{long_run}",
            }

            def get(path: str):
                def call():
                    r = client.get(path, headers=headers)
                    assert r.status_code == 200, r.text
                return call

            out["api"] = {name: timed(get(path), repeat) for name, path in routes.items()}
        out["plans"] = {
            "worker 7d": plan(engine, charts._WORKER_TREND, {"worker": "embedding", "step": week.step,
                                                             "span": week.span}),
            "runner 7d": plan(engine, charts._RUNNER_SLOTS, {"runner_id": runner, "step": rweek.step,
                                                             "span": rweek.span}),
            "run series": plan(engine, charts._RUN_SERIES, {"run_id": long_run, "points": 300,
                                                            "min_bucket": charts.MIN_BUCKET_SECONDS}),
        }
        prune = []
        while True:
            t = time.perf_counter()
            n = charts.prune_samples(engine, charts.DEFAULT_SAMPLES_RETENTION_DAYS)
            prune.append(((time.perf_counter() - t) * 1000, n))
            if n == 0:
                break
        idle = timed(lambda: charts.prune_samples(engine, charts.DEFAULT_SAMPLES_RETENTION_DAYS), repeat)
        batches = [ms for ms, n in prune if n]
        out["prune"] = {"statements": len(prune), "deleted": sum(n for _, n in prune),
                        "max_ms_per_batch": round(max(batches), 1) if batches else 0.0,
                        "nothing_to_prune": idle}
    finally:
        engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--samples-rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    report: dict = {}
    with bench_database("bench_charts") as url:
        # The cost windows first, on a small ledger: nothing else writes meanwhile.
        report["cost_per_run"] = cost_per_run(url, args.seconds)
        print(json.dumps(report["cost_per_run"], indent=1, default=str), flush=True)
        report["queries"] = query_times(url, args.runs, args.samples_rows, args.repeat)
    for name, plan_text in report["queries"].pop("plans").items():
        print(f"--- plan: {name}\n{plan_text}")
    print(json.dumps(report["queries"], indent=1, default=str))
    slow = [f"{where}: {name}" for where in ("statement", "api") for name, t in report["queries"][where].items()
            if t["p50_ms"] > TARGET_MS and not name.startswith("baseline") and "before" not in name]
    print("chart queries p50 <= 50 ms:", "yes" if not slow else f"NO: {slow}")


if __name__ == "__main__":
    main()
