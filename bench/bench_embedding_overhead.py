"""Orchestration overhead of the runner: ``embedding`` over N documents through the runner against a bare
script with the same model, the same forward batch size and the same texts, on the same machine, in one run.

Both sides are timed the same way: wall clock of a fresh process from its start to its end, each paying
the interpreter, torch/transformers imports and the model load.
  * runner: ``runner.oneshot.run_once`` (row, claim, spawned child through the daemon's entry point,
    resolve, record_start, batches of db_batch_size read by the stamp query, fenced commits of vectors
    and stamps, progress, heartbeats, finish);
  * bare: ``python -c`` that reads the same composed texts (one SELECT) and embeds them with the same
    engine class, writing nothing.
Rounds alternate (bare, runner, bare, runner...) and the best of each side is compared, to damp the
noise of a shared machine. Target: runner throughput >= 0.90 x bare (0.95 hoped). Run:
    .venv/bin/python bench/bench_embedding_overhead.py [--docs 2000] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text

from bench._pg import bench_database
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive.demo import demo_path

BATCH = 32          # texts per forward pass, both sides
DB_BATCH = 128      # documents per fenced commit (the worker's default)

BARE = r"""
import sys, time, json
t0 = time.perf_counter()
from sqlalchemy import create_engine, text
from scrinalia.domains.archive.workers.engines.embedding import TransformersEmbedder
from scrinalia.domains.archive.workers.stamps import COMPOSED_TEXT_SQL
engine = create_engine(sys.argv[1])
with engine.connect() as conn:
    sql = "SELECT " + COMPOSED_TEXT_SQL.format(a="d") + " FROM archive_documents d ORDER BY id"
    texts = list(conn.execute(text(sql)).scalars())
model = TransformersEmbedder({"model": None, "device": "cpu", "dtype": "float32", "batch_size": {batch},
                              "max_length": 256})
t1 = time.perf_counter()
vectors = []
for start in range(0, len(texts), {db_batch}):
    vectors.extend(model.embed(texts[start:start + {db_batch}]))
t2 = time.perf_counter()
print(json.dumps({"n": len(vectors), "embed_seconds": t2 - t1, "setup_seconds": t1 - t0}))
""".replace("{batch}", str(BATCH)).replace("{db_batch}", str(DB_BATCH))


def seed(engine, n: int) -> None:
    records = [json.loads(line) for line in demo_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = []
    for i in range(n):
        r = dict(records[i % len(records)])
        r["reference_code"] = f"{r['reference_code']}/{i}"
        rows.append(r)
    with engine.begin() as conn:
        conn.execute(text("""INSERT INTO archive_documents (reference_code, title, scope_and_content,
            admin_biographical_history, provenance) SELECT reference_code, title, scope_and_content,
            admin_biographical_history, provenance FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS x(
            reference_code text, title text, scope_and_content text, admin_biographical_history text,
            provenance text)"""),
            {"rows": json.dumps(rows)})


def bare(url: str) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", BARE, url], check=True, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    return {"wall_seconds": wall, **json.loads(out.stdout.strip().splitlines()[-1])}


def runner(url: str, engine, n: int) -> dict:
    from runner.oneshot import run_once

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_document_embeddings"))
        conn.execute(text("UPDATE archive_documents SET execution_log = execution_log - 'embedding'"))
    t0 = time.perf_counter()
    run = run_once(url, "embedding", {"preset": "cpu", "db_batch_size": DB_BATCH,
                                      "engine_options": {"batch_size": BATCH}}, requested_by="bench")
    wall = time.perf_counter() - t0
    assert run.status == "SUCCESS" and run.result is not None and run.metrics is not None, run.error
    assert run.result["embedded"] == n, run.result
    return {"wall_seconds": wall, "worker_seconds": run.metrics.get("worker_seconds"),
            "units_per_second": run.metrics.get("units_per_second")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with bench_database("bench_embed") as url:
        engine = create_engine_from_url(url)
        seed(engine, args.docs)
        with engine.connect() as conn:
            conn.execute(text("ANALYZE archive_documents"))
        bares, runs = [], []
        for i in range(args.rounds):
            bares.append(bare(url))
            print(f"round {i + 1} bare:   {bares[-1]}", flush=True)
            runs.append(runner(url, engine, args.docs))
            print(f"round {i + 1} runner: {runs[-1]}", flush=True)
        engine.dispose()
    best_bare = min(b["wall_seconds"] for b in bares)
    best_run = min(r["wall_seconds"] for r in runs)
    bare_tp, run_tp = args.docs / best_bare, args.docs / best_run
    steady_bare = max(args.docs / b["embed_seconds"] for b in bares)
    steady_run = max(r["units_per_second"] or 0 for r in runs)
    summary = {
        "docs": args.docs, "batch_size": BATCH, "db_batch_size": DB_BATCH, "rounds": args.rounds,
        "bare_docs_per_s": round(bare_tp, 2), "runner_docs_per_s": round(run_tp, 2),
        "ratio": round(run_tp / bare_tp, 3),
        "bare_embed_only_docs_per_s": round(steady_bare, 2),
        "runner_worker_docs_per_s": round(steady_run, 2),
        "steady_ratio": round(steady_run / steady_bare, 3),
        "target": 0.90, "met": run_tp / bare_tp >= 0.90,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
