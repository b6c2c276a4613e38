"""Orchestration overhead of the runner: ``embedding`` over N documents through the runner against a bare
script with the same model, the same forward batch size and the same texts, on the same machine, in one run.

Every side is timed the same way: wall clock of a fresh process from its start to its end, each paying
the interpreter, torch/transformers imports and the model load.
  * runner: ``runner.oneshot.run_once`` (row, claim, spawned child through the daemon's entry point,
    resolve, record_start, batches of db_batch_size read by the stamp query, fenced commits of vectors
    and stamps, progress, heartbeats, finish);
  * bare: ``python -c`` that reads the same composed texts (one SELECT) and embeds them with the same
    engine class, writing nothing (the figure of the issues before);
  * bare_store: the same script, which also keeps its vectors as a hand-written one would: the worker's
    upsert, one commit per db_batch_size documents, no stamps, no fence, no ledger.
Against ``bare`` the runner pays for storing its results as well as for its orchestration; against
``bare_store`` only for the orchestration. Each side also reports the CPU the rest of the machine spent
meanwhile (/proc/stat less the side's own processes: the database's backends, WAL writer, autovacuum), which
on a small host shares the cores the model computes on.
Rounds run the three in turn. Two figures damp the noise of a shared machine: the best of each side against
each other, and the median of the rounds' own ratios (a round's sides ran back to back, so a slow minute of
the host weighs on all). The steady ratio compares the embedding loops alone: the bare script's time after
its model load against the worker's time less its model load (the run's ``model_load`` metric). Target:
runner throughput >= 0.95 x bare. Run:
    .venv/bin/python bench/bench_embedding_overhead.py [--docs 2000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
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
from scrinalia.domains.archive.workers.embedding import UPSERT
from scrinalia.domains.archive.workers.engines.embedding import TransformersEmbedder
from scrinalia.domains.archive.workers.stamps import COMPOSED_TEXT_SQL
engine = create_engine(sys.argv[1])
store = sys.argv[2] == "store"
composed = COMPOSED_TEXT_SQL.format(a="d")
with engine.connect() as conn:
    docs = conn.execute(text(f"SELECT d.id, {composed} AS text, md5({composed}) AS stamp "
                             "FROM archive_documents d ORDER BY id")).all()
model = TransformersEmbedder({"model": None, "device": "cpu", "dtype": "float32", "batch_size": {batch},
                              "max_length": 256})
t1 = time.perf_counter()
n = 0
for start in range(0, len(docs), {db_batch}):
    batch = docs[start:start + {db_batch}]
    vectors = model.embed([d.text for d in batch])
    n += len(vectors)
    if store:  # what a hand-written script that keeps its vectors does: the worker's upsert, a commit per batch
        with engine.begin() as conn:
            conn.execute(UPSERT, [{"document_id": d.id, "model": model.model_name, "dimensions": len(v), "vector": v,
                                   "text_md5": d.stamp, "run_id": None} for d, v in zip(batch, vectors)])
t2 = time.perf_counter()
print(json.dumps({"n": n, "embed_seconds": t2 - t1, "setup_seconds": t1 - t0}))
""".replace("{batch}", str(BATCH)).replace("{db_batch}", str(DB_BATCH))


def busy_seconds() -> float:
    """CPU time the whole machine spent busy so far (/proc/stat, every core): less a side's own processes,
    what the others (the database's backends, WAL writer, autovacuum) did meanwhile."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def cpu_seconds() -> float:
    """This process's CPU and its waited-for children's (a bare script, the runner's child)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


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


def clear(engine) -> None:
    """The same database for every side: no vector, no stamp, and the previous side's dead rows vacuumed
    (left, they grew round after round and autovacuum took them up in the middle of a later side, on the
    cores the model computes on)."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_document_embeddings"))
        conn.execute(text("UPDATE archive_documents SET execution_log = execution_log - 'embedding'"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE archive_documents, archive_document_embeddings, archive_worker_runs"))


def bare(url: str, engine, store: bool) -> dict:
    clear(engine)
    t0, b0, c0 = time.perf_counter(), busy_seconds(), cpu_seconds()
    out = subprocess.run([sys.executable, "-c", BARE, url, "store" if store else "embed"], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return {"wall_seconds": wall, "cpu_seconds": cpu, "others_cpu_seconds": busy_seconds() - b0 - cpu,
            **json.loads(out.stdout.strip().splitlines()[-1])}


def runner(url: str, engine, n: int) -> dict:
    from runner.oneshot import run_once

    clear(engine)
    t0, b0, c0 = time.perf_counter(), busy_seconds(), cpu_seconds()
    run = run_once(url, "embedding", {"preset": "cpu", "db_batch_size": DB_BATCH,
                                      "engine_options": {"batch_size": BATCH}}, requested_by="bench")
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    others = busy_seconds() - b0 - cpu
    assert run.status == "SUCCESS" and run.result is not None and run.metrics is not None, run.error
    assert run.result["embedded"] == n, run.result
    load = sum(m.get("seconds") or 0.0 for m in run.metrics.get("model_load") or [])
    return {"wall_seconds": wall, "cpu_seconds": cpu, "others_cpu_seconds": others,
            "worker_seconds": run.metrics.get("worker_seconds"), "model_load_seconds": load}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with bench_database("bench_embed") as url:
        engine = create_engine_from_url(url)
        seed(engine, args.docs)
        with engine.connect() as conn:
            conn.execute(text("ANALYZE archive_documents"))
        sides: dict[str, list[dict]] = {"bare": [], "bare_store": [], "runner": []}
        for i in range(args.rounds):
            for side, measure in (("bare", lambda: bare(url, engine, store=False)),
                                  ("bare_store", lambda: bare(url, engine, store=True)),
                                  ("runner", lambda: runner(url, engine, args.docs))):
                sides[side].append(measure())
                print(f"round {i + 1} {side}: {sides[side][-1]}", flush=True)
        engine.dispose()
    runs = sides["runner"]
    summary: dict = {"docs": args.docs, "batch_size": BATCH, "db_batch_size": DB_BATCH, "rounds": args.rounds,
                     "runner_docs_per_s": round(args.docs / min(r["wall_seconds"] for r in runs), 2),
                     "runner_others_cpu_seconds": [round(r["others_cpu_seconds"], 2) for r in runs]}
    # The embedding loops alone: a bare script after its model load, the worker less its model load.
    steady_run = max(args.docs / (r["worker_seconds"] - r["model_load_seconds"]) for r in runs)
    for side in ("bare", "bare_store"):
        paired = [b["wall_seconds"] / r["wall_seconds"] for b, r in zip(sides[side], runs, strict=True)]
        best = min(b["wall_seconds"] for b in sides[side]) / min(r["wall_seconds"] for r in runs)
        summary[side] = {
            "docs_per_s": round(args.docs / min(b["wall_seconds"] for b in sides[side]), 2),
            "others_cpu_seconds": [round(b["others_cpu_seconds"], 2) for b in sides[side]],
            "ratio_best": round(best, 3), "ratio_per_round": [round(x, 3) for x in paired],
            "ratio_median": round(statistics.median(paired), 3),
            "steady_ratio": round(steady_run / max(args.docs / b["embed_seconds"] for b in sides[side]), 3),
            "met": min(best, statistics.median(paired)) >= 0.95,
        }
    summary["target"] = 0.95
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
