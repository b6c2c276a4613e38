"""The API on a big ledger: GET /api/v1/system/workers p50/p95 and POST enqueue p50.

Seeds 1,000,000 finished runs (a year of history, ~10% failed with ~60 fingerprints), 100 runners
(online, stale, stopped) and 100,000 documents whose stamps leave a realistic backlog per worker, then
times the real app in-process (ASGI, bearer session lookup included) against the real catalogue.
The counts come from ``archive_stamp_counts`` (kept by the triggers of migration 0010, exact on every
request); the live computation they replace is timed next to them, and the two are checked equal.
Targets: workers p50 <= 20 ms with the counts uncached (issue 14); enqueue p50 <= 10 ms. Run:
    .venv/bin/python bench/bench_api.py [--runs 1000000] [--documents 100000] [--runners 100] [--samples 200]
        [--counts-max-age 15]   (GET /system/workers timed from the summary uncached, from the documents as
        before migration 0010, and cached at each value given; the three interleaved request by request)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import bench_database, percentile
from scrinalia.db.engine import create_engine_from_url

SEED_DOCUMENTS = text(
    """
    INSERT INTO archive_documents (reference_code, title, scope_and_content, admin_biographical_history,
                                   provenance, date_text, status)
    SELECT 'PT/ARQ/' || g, 'Carta de ' || g || ' sobre a administracao', repeat('Ambito e conteudo ' || g || '. ', 8),
           CASE WHEN g % 3 = 0 THEN 'Historia administrativa ' || g END, 'Proveniencia ' || (g % 50),
           (1800 + g % 200)::text,
           (ARRAY['DRAFT','PUBLISHED','NEEDS_REVIEW','HUMAN_APPROVED']::document_status[])[1 + g % 4]
      FROM generate_series(1, :n) AS g
    """
)

# Backlogs: embedding 10% pending, ner 20%, typology 30%, quality 40% (cleaning 50%, below); ~1% ERROR.
STAMP_DOCUMENTS = text(
    """
    UPDATE archive_documents AS d SET execution_log = jsonb_strip_nulls(jsonb_build_object(
        'embedding', CASE WHEN d.id % 10 <> 0 THEN jsonb_build_object(
            'stamp', archive_text_stamp(d.title, d.scope_and_content, d.admin_biographical_history, d.provenance),
            'status', CASE WHEN d.id % 101 = 0 THEN 'ERROR' ELSE 'DONE' END, 'run_id', 'seed') END,
        'ner', CASE WHEN d.id % 10 >= 2 THEN jsonb_build_object(
            'stamp', archive_text_stamp(d.title, d.scope_and_content, d.admin_biographical_history, d.provenance),
            'status', CASE WHEN d.id % 103 = 0 THEN 'ERROR' ELSE 'DONE' END, 'run_id', 'seed') END,
        'typology', CASE WHEN d.id % 10 >= 3 THEN jsonb_build_object(
            'stamp', md5(d.title), 'status', 'DONE', 'run_id', 'seed') END))
    """
)

STAMP_QUALITY = text(
    """
    UPDATE archive_documents AS d SET execution_log = execution_log || jsonb_build_object('quality-validator',
        jsonb_build_object('stamp', archive_quality_stamp(d.title, d.scope_and_content, d.admin_biographical_history,
                           d.provenance, d.date_text, d.date_start, d.date_end, d.execution_log),
                           'status', 'DONE', 'run_id', 'seed'))
     WHERE d.id % 10 >= 4
    """
)

# cleaning: 50% pending (never cleaned), the rest cleaned with the current rule set.
STAMP_CLEANING = text(
    """
    UPDATE archive_documents AS d SET cleaning_ruleset = archive_cleaning_ruleset(),
        cleaning_text_stamp = archive_cleaning_text_stamp(d.title, d.scope_and_content,
                                                          d.admin_biographical_history, d.provenance),
        execution_log = d.execution_log || jsonb_build_object('cleaning', (
            SELECT jsonb_object_agg(r.id::text, jsonb_build_object(
                'stamp', md5(archive_cleaning_rule_signature(r.field, r.pattern, r.replacement) || chr(31) || d.title),
                'status', 'DONE', 'run_id', 'seed'))
              FROM archive_cleaning_rules AS r WHERE r.kind = 'REWRITE'))
     WHERE d.id % 10 >= 5 AND d.status <> 'HUMAN_APPROVED'
    """
)

SEED_RUNNERS = text(
    """
    INSERT INTO archive_worker_runners (runner_id, name, hostname, pid, package_version, schema_revision,
        capabilities, concurrency, heartbeat_seconds, lease_seconds, devices, children, started_at,
        last_heartbeat_at, stopped_at)
    SELECT gen_random_uuid(), 'gpu-' || g, 'host-' || (g % 20), 1000 + g, '1.6.0', :revision,
           CASE WHEN g % 3 = 0 THEN ARRAY['embedding','ner','typology','quality-validator','cleaning','gpu-probe']
                WHEN g % 3 = 1 THEN ARRAY['embedding','gpu-probe'] ELSE ARRAY['cleaning','typology'] END,
           1 + g % 2, 15, 60, '[{"name": "NVIDIA H200", "memory_mib": 143771}]'::jsonb,
           '[]'::jsonb, now() - interval '1 day',
           CASE WHEN g % 10 < 7 THEN now() ELSE now() - interval '2 hours' END,
           CASE WHEN g % 10 = 9 THEN now() - interval '1 hour' END
      FROM generate_series(1, :n) AS g
    """
)

SEED_RUNS = text(
    """
    INSERT INTO archive_worker_runs
        (worker_name, status, trigger, request, queued_at, started_at, finished_at, duration_ms,
         runner_id, attempt, error, exit_reason)
    SELECT (ARRAY['embedding','ner','typology','quality-validator','cleaning','gpu-probe'])[1 + g % 6],
           CASE WHEN g % 10 = 0 THEN 'FAILED'::worker_run_status WHEN g % 29 = 0 THEN 'INTERRUPTED'
                WHEN g % 31 = 0 THEN 'CANCELLED' ELSE 'SUCCESS' END,
           (ARRAY['API','SCHEDULE','CLI']::worker_run_trigger[])[1 + g % 3], '{"db_batch_size": 32}'::jsonb,
           now() - make_interval(secs => g * 31.5), now() - make_interval(secs => g * 31.5 - 1),
           now() - make_interval(secs => g * 31.5 - 30), 29000, :runner, 1,
           CASE WHEN g % 10 = 0 THEN (ARRAY['RuntimeError: CUDA error: out of memory on device ',
                 'OSError: cannot open /models/m', 'ValueError: bad row ',
                 'TimeoutError: engine stalled after '])[1 + (g / 10) % 4]
                 || (g % 15) END,
           CASE WHEN g % 10 = 0 THEN 'exception' END
      FROM generate_series(:start, :stop - 1) AS g
    """
)


def seed_documents(conn, n_docs: int) -> None:
    """``n_docs`` documents with their stamps (some stale, some failed) and two cleaning rules."""
    conn.execute(SEED_DOCUMENTS, {"n": n_docs})
    conn.execute(STAMP_DOCUMENTS)
    conn.execute(STAMP_QUALITY)
    conn.execute(text(
        "INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) VALUES "
        "('trim-dots', 'REWRITE', 'title', '\\.+$', ''), ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))
    conn.execute(STAMP_CLEANING)


def seed(engine, n_runs: int, n_docs: int, n_runners: int) -> None:
    from scrinalia.db import migrate

    t0 = time.perf_counter()
    with engine.begin() as conn:
        seed_documents(conn, n_docs)
        conn.execute(SEED_RUNNERS, {"n": n_runners, "revision": migrate.head_revision()})
        runner = conn.execute(text("SELECT runner_id FROM archive_worker_runners LIMIT 1")).scalar_one()
    step = 200_000
    for start in range(1, n_runs + 1, step):
        with engine.begin() as conn:
            conn.execute(SEED_RUNS, {"start": start, "stop": min(n_runs + 1, start + step), "runner": runner})
    with engine.begin() as conn:
        # a RUNNING run with progress (held by an online runner) and a QUEUED one
        conn.execute(text(
            "INSERT INTO archive_worker_runs (worker_name, status, trigger, request, started_at, runner_id, "
            "heartbeat_at, lease_expires_at, progress) VALUES ('ner', 'RUNNING', 'API', '{}', now(), "
            "(SELECT runner_id FROM archive_worker_runners WHERE stopped_at IS NULL AND 'ner' = ANY(capabilities) "
            " AND last_heartbeat_at > now() - interval '1 minute' LIMIT 1), now(), now() + interval '60 seconds', "
            "'{\"done\": 1200, \"total\": 20000, \"unit\": \"document\"}')"))
        conn.execute(text("INSERT INTO archive_worker_runs (worker_name, status, trigger, request) "
                          "VALUES ('typology', 'QUEUED', 'SCHEDULE', '{}')"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    print(f"seeded {n_runs} runs, {n_docs} documents, {n_runners} runners in {time.perf_counter() - t0:.1f} s",
          flush=True)


def login(client) -> dict[str, str]:
    token = client.post("/api/v1/auth/login", json={"email": "bench@example.org", "password": "a bench passphrase",
                                                    "issue_token": True}).json()["token"]
    return {"Authorization": f"Bearer {token}"}


#: The ways GET /system/workers is timed, interleaved request by request: (label, counts max age, the
#: counts computed from the documents as before migration 0010).
WORKERS_VARIANTS = {
    "summary": ("counts from archive_stamp_counts, uncached (default)", 0.0, False),
    "live": ("counts from the documents, uncached (before 0010)", 0.0, True),
}


def time_workers(engine, samples: int, variants: dict[str, tuple[str, float, bool]]) -> dict[str, list[float]]:
    """GET /system/workers timings, one fresh app per variant, the variants' requests interleaved (so
    the shared machine's load falls on each alike)."""
    import contextlib

    from fastapi.testclient import TestClient

    from scrinalia.api import catalogue_view
    from scrinalia.api.app import create_app
    from scrinalia.api.settings import ApiSettings

    summary_counts = catalogue_view.unit_counts

    def live_counts(engine, catalogue, conn=None):
        return catalogue_view.live_unit_counts(engine, catalogue)

    out: dict[str, list[float]] = {label: [] for label, _, _ in variants.values()}
    with contextlib.ExitStack() as stack:
        clients = []
        for label, max_age, live in variants.values():
            app = create_app(engine=engine, ui_dir="/nonexistent",
                             api_settings=ApiSettings(cookie_secure=False, counts_max_age_seconds=max_age))
            client = stack.enter_context(TestClient(app))
            clients.append((label, live, client, login(client)))
        try:
            for i in range(samples + 10):  # the first 10 rounds warm up
                for label, live, client, headers in clients:
                    catalogue_view.unit_counts = live_counts if live else summary_counts
                    t = time.perf_counter()
                    r = client.get("/api/v1/system/workers", headers=headers)
                    ms = (time.perf_counter() - t) * 1000
                    assert r.status_code == 200, r.text
                    if i >= 10:
                        out[label].append(ms)
        finally:
            catalogue_view.unit_counts = summary_counts
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--runners", type=int, default=100)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--counts-max-age", type=float, action="append", default=None, metavar="SECONDS",
                        help="also time GET /system/workers with API_COUNTS_MAX_AGE_SECONDS at this value (> 0: "
                             "cached), interleaved with the uncached summary and the live count (default: 15)")
    args = parser.parse_args()
    max_ages = args.counts_max_age or [15.0]

    from fastapi.testclient import TestClient

    from scrinalia.api.app import create_app
    from scrinalia.api.settings import ApiSettings
    from scrinalia.domains.identity.users import create_user

    with bench_database("bench_api") as url:
        engine = create_engine_from_url(url, pool_size=5, max_overflow=5)
        seed(engine, args.runs, args.documents, args.runners)
        create_user(engine, "bench@example.org", "a bench passphrase", "ADMIN")
        variants = dict(WORKERS_VARIANTS)
        for max_age in max_ages:
            if max_age > 0:
                label = f"counts cached, API_COUNTS_MAX_AGE_SECONDS={max_age:g}"
                variants[f"cached {max_age:g}"] = (label, max_age, False)
        workers_ms = time_workers(engine, args.samples, variants)
        with engine.connect() as conn:
            load = conn.execute(text("SELECT 1")).scalar_one() and os.getloadavg()
        app = create_app(engine=engine, api_settings=ApiSettings(cookie_secure=False), ui_dir="/nonexistent")
        catalogue = sorted(app.state.ctx.catalogue)
        with TestClient(app) as client:
            headers = login(client)
            # the counts statement alone (the part that grows with the archive)
            from scrinalia.api import catalogue_view

            counts_ms, live_counts_ms = [], []
            for _ in range(50):  # interleaved: the summary's read and the live count it replaces
                t = time.perf_counter()
                served = catalogue_view.unit_counts(engine, app.state.ctx.catalogue)
                counts_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                live = catalogue_view.live_unit_counts(engine, app.state.ctx.catalogue)
                live_counts_ms.append((time.perf_counter() - t) * 1000)
            assert served == live, (served, live)
            with engine.connect() as conn:
                summary_rows = conn.execute(text("SELECT count(*) FROM archive_stamp_counts")).scalar_one()

            enqueue_ms = []
            worker = "embedding"
            for _ in range(args.samples):
                t = time.perf_counter()
                r = client.post(f"/api/v1/system/workers/{worker}/runs", headers=headers, json={"db_batch_size": 16})
                enqueue_ms.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 201, r.text
                with engine.begin() as conn:  # free the slot, untimed
                    conn.execute(text("UPDATE archive_worker_runs SET status = 'CANCELLED', finished_at = now() "
                                      "WHERE run_id = :r"), {"r": uuid.UUID(r.json()["run_id"])})
            runs_ms = []
            for _ in range(50):
                t = time.perf_counter()
                client.get("/api/v1/system/runs", headers=headers, params={"status": "FAILED", "limit": 50})
                runs_ms.append((time.perf_counter() - t) * 1000)
            failures_ms = []
            for _ in range(50):
                t = time.perf_counter()
                client.get("/api/v1/system/failures", headers=headers, params={"days": 30})
                failures_ms.append((time.perf_counter() - t) * 1000)
        engine.dispose()

    def stats(values):
        return {"p50": round(percentile(values, 0.5), 2), "p95": round(percentile(values, 0.95), 2)}

    out = {
        "runs": args.runs, "documents": args.documents, "runners": args.runners, "samples": args.samples,
        "catalogue": catalogue,
        "get_workers_ms": {label: stats(ms) for label, ms in workers_ms.items()},
        "load_average_after": [round(x, 2) for x in load],
        "unit_counts_statement_ms": stats(counts_ms),
        "live_unit_counts_statement_ms": stats(live_counts_ms),
        "summary_rows": summary_rows,
        "counts": served,
        "post_enqueue_ms": stats(enqueue_ms),
        "get_runs_failed_page_ms": stats(runs_ms),
        "get_failures_30d_ms": stats(failures_ms),
    }
    default = out["get_workers_ms"][WORKERS_VARIANTS["summary"][0]]
    out["targets_met"] = {"get_workers_p50<=20ms": default["p50"] <= 20,
                          "post_enqueue_p50<=10ms": out["post_enqueue_ms"]["p50"] <= 10}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
