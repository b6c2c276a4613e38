"""The cost of the workers' queue counts (``pending_count`` and ``counts``) on 100k documents.

States measured: everything pending (a fresh import), everything stamped, then 1% of the texts edited,
then the cleaning rule edited (every governed document pending again for cleaning). The plans of the
cleaning queue's count and fetch (under its planner settings) are printed for each state.
Each figure is the median of --samples calls. Run:
    .venv/bin/python bench/bench_stamp_counts.py [--docs 100000] [--samples 20]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import bench_database, percentile
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive.workers import cleaning, embedding, ner, quality, typology

SPECS = [embedding.SPEC, ner.SPEC, typology.SPEC, quality.SPEC, cleaning.SPEC]

SEED = text("""
INSERT INTO archive_documents (reference_code, title, scope_and_content, admin_biographical_history, provenance,
                               date_start, status)
SELECT 'B/' || g, 'Letters of correspondent ' || g || ' to the council of town ' || (g % 97),
       repeat('Scope and content of a described series, with many words. ', 6),
       'Administrative history of the creator ' || (g % 500),
       'Transferred in ' || (1900 + g % 100),
       make_date(1500 + g % 400, 1, 1),
       CASE WHEN g % 50 = 0 THEN 'HUMAN_APPROVED'::document_status ELSE 'DRAFT'::document_status END
  FROM generate_series(1, :n) AS g
""")

STAMP_ALL = text("""
UPDATE archive_documents SET execution_log = jsonb_build_object(
  'embedding', jsonb_build_object('stamp', archive_text_stamp(title, scope_and_content, admin_biographical_history,
                                                              provenance), 'status', 'DONE', 'run_id', 'r'),
  'ner', jsonb_build_object('stamp', archive_text_stamp(title, scope_and_content, admin_biographical_history,
                                                        provenance), 'status', 'DONE', 'run_id', 'r'),
  'typology', jsonb_build_object('stamp', md5(title), 'status', 'DONE', 'run_id', 'r'))
""")
STAMP_QUALITY = text("""
UPDATE archive_documents SET execution_log = execution_log || jsonb_build_object('quality-validator',
  jsonb_build_object('stamp', archive_quality_stamp(title, scope_and_content, admin_biographical_history, provenance,
                                                    date_text, date_start, date_end, execution_log), 'status', 'DONE'))
""")
RULE = text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
            "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')")
STAMP_CLEANING = text("""
UPDATE archive_documents d SET cleaning_ruleset = archive_cleaning_ruleset(),
  cleaning_text_stamp = archive_cleaning_text_stamp(title, scope_and_content, admin_biographical_history, provenance),
  execution_log = d.execution_log || jsonb_build_object('cleaning',
  (SELECT jsonb_object_agg(r.id::text, jsonb_build_object('stamp',
      md5(archive_cleaning_rule_signature(r.field, r.pattern, r.replacement) || chr(31) || d.title),
      'status', 'DONE')) FROM archive_cleaning_rules r WHERE r.kind = 'REWRITE'))
 WHERE d.status <> 'HUMAN_APPROVED'
""")
EDIT = text("UPDATE archive_documents SET scope_and_content = scope_and_content || ' (edited)' WHERE id % 100 = 1")
RULE_EDIT = text("UPDATE archive_cleaning_rules SET replacement = '  ' WHERE name = 'spaces'")


def timed(fn, samples):
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        value = fn()
        out.append((time.perf_counter() - t0) * 1000)
    return value, percentile(out, 0.5)


def measure(engine, samples, label):
    rows = []
    for spec in SPECS:
        pending, p_ms = timed(partial(spec.pending_count, engine), samples)
        counts, c_ms = timed(partial(spec.counts, engine), samples)
        rows.append({"state": label, "worker": spec.name, "pending": pending, "pending_count_ms": round(p_ms, 2),
                     "counts": counts, "counts_ms": round(c_ms, 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def cleaning_plans(engine):
    """EXPLAIN ANALYZE of the cleaning queue's pending count and first fetch, under its planner settings."""
    queue, out = cleaning.QUEUE, []
    for sql, params, fetch in ((f"SELECT {queue.pending_count_sql()}", {}, False),
                               (str(queue.fetch_sql("d.title")), {"after": 0, "limit": 100}, True)):
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL jit = off"))
            queue.prepare(conn, fetch=fetch)
            plan = conn.execute(text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql), params).scalars()
            out.append("\n".join(line for line in plan if "Recheck Cond" not in line))
    return "\n\n".join(out)


def vacuum(url):
    from sqlalchemy import create_engine
    eng = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(text("VACUUM ANALYZE archive_documents"))
    eng.dispose()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    with bench_database("bench_stamps") as url:
        engine = create_engine_from_url(url)
        with engine.begin() as conn:
            conn.execute(SEED, {"n": args.docs})
            conn.execute(RULE)
        vacuum(url)
        results = measure(engine, args.samples, "all pending")
        print(cleaning_plans(engine))
        with engine.begin() as conn:
            conn.execute(STAMP_ALL)
            conn.execute(STAMP_QUALITY)
            conn.execute(STAMP_CLEANING)
        vacuum(url)
        results += measure(engine, args.samples, "all stamped")
        print(cleaning_plans(engine))
        with engine.begin() as conn:
            conn.execute(EDIT)
        vacuum(url)
        results += measure(engine, args.samples, "1% edited")
        print(cleaning_plans(engine))
        with engine.begin() as conn:
            conn.execute(RULE_EDIT)
        vacuum(url)
        results += measure(engine, args.samples, "rule edited")
        print(cleaning_plans(engine))
        engine.dispose()


if __name__ == "__main__":
    main()
