"""The schema's SQL functions work with an empty search_path: autovacuum's ANALYZE, pg_dump/pg_restore
(issue 10, defect 11; migration 0002, decision 0050)."""
from __future__ import annotations

import subprocess
import time

from sqlalchemy import text
from sqlalchemy.pool import NullPool

from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.local_cluster import find_bindir
from scrinalia.domains.archive.workers import embedding, quality
from tests.foundation.clusters import create_database, private_cluster, psql
from tests.workers.helpers import insert_docs

# A sample argument per type, to call every function of the schema.
_SAMPLES = {"text": "'x'", "date": "DATE '2001-02-03'", "jsonb": "'{\"ner\": {\"run_id\": \"r\"}}'::jsonb",
            "document_status": "'DRAFT'", "timestamp with time zone": "now()", "integer": "1",
            "double precision": "600.0"}


def _docs(n: int) -> list[dict]:
    return [{"reference_code": f"R/{i}", "title": f"Letters {i}", "scope_and_content": f"Forty letters, {i}.",
             "date_text": "1750", "date_start": "1750-01-01"} for i in range(n)]


def test_every_function_of_the_schema_runs_with_an_empty_search_path(engine):
    with engine.connect() as conn:
        functions = conn.execute(text(
            "SELECT p.oid::regprocedure::text AS signature, p.proname,"
            "       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) AS types"
            "  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prokind = 'f'"
            "   AND p.prorettype <> 'trigger'::regtype")).all()  # trigger functions run only as triggers
        assert {f.proname for f in functions} >= {"archive_text_stamp", "archive_quality_stamp",
                                                  "archive_cleaning_ruleset", "archive_composed_text"}
        conn.execute(text("SET search_path = ''"))
        for f in functions:
            args = ", ".join(_SAMPLES[t] for t in f.types)
            value = conn.execute(text(f"SELECT public.{f.proname}({args})::text")).scalar()
            assert value is None or isinstance(value, str), f.signature


def test_analyze_with_an_empty_search_path(engine, database_url):
    """On a new connection: a connection that wrote the table has the index predicates in its cache,
    already inlined with the normal search_path, and would hide the defect."""
    insert_docs(engine, _docs(20))
    fresh = create_engine_from_url(database_url, poolclass=NullPool, connect_args={"options": "-c search_path="})
    try:
        with fresh.connect() as conn:
            assert conn.execute(text("SHOW search_path")).scalar() in ('', '""')
            conn.execute(text("ANALYZE public.archive_documents"))
            conn.commit()
    finally:
        fresh.dispose()


def test_the_workers_queues_still_read_their_partial_indexes(engine):
    """No SET search_path on the functions: they still inline, so the planner matches the predicate."""
    insert_docs(engine, _docs(50))
    with engine.begin() as conn:
        conn.execute(text("ANALYZE archive_documents"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        for spec, index in ((embedding.SPEC, "ix_documents_pending_embedding"),
                            (quality.SPEC, "ix_documents_pending_quality")):
            pending = spec.queue.pending("d")
            plan = "\n".join(conn.execute(text(
                f"EXPLAIN SELECT d.id FROM archive_documents AS d WHERE {pending} ORDER BY d.id LIMIT 10")).scalars())
            assert index in plan, plan


def test_pg_dump_then_pg_restore_into_an_empty_database(engine, database_url, empty_database_url, tmp_path):
    insert_docs(engine, _docs(30))
    bindir = find_bindir()
    dump = tmp_path / "archive.dump"
    subprocess.run([str(bindir / "pg_dump"), "-Fc", "-f", str(dump), "-d", database_url.replace("+psycopg", "")],
                   check=True, capture_output=True, timeout=120)
    proc = subprocess.run(
        [str(bindir / "pg_restore"), "--exit-on-error", "--no-owner", "-d",
         empty_database_url.replace("+psycopg", ""), str(dump)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    restored = create_engine_from_url(empty_database_url)
    try:
        with restored.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM archive_documents")).scalar() == 30
            assert conn.execute(text(
                "SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'ix_documents_pending_%'")).scalar() == 5
        assert embedding.SPEC.pending_count(restored) == 30
    finally:
        restored.dispose()


def test_autovacuum_analyzes_archive_documents():
    """A cluster of its own with a one-second naptime; the table's threshold lowered so 40 rows suffice."""
    with private_cluster({"autovacuum_naptime": "1", "log_autovacuum_min_duration": "0"}) as cluster:
        url = create_database(cluster, "scrinalia")
        eng = create_engine_from_url(url)
        try:
            with eng.begin() as conn:
                conn.execute(text("ALTER TABLE archive_documents SET (autovacuum_analyze_threshold = 10, "
                                  "autovacuum_analyze_scale_factor = 0)"))
            insert_docs(eng, _docs(40))
            deadline = time.monotonic() + 60
            last = None
            while last is None and time.monotonic() < deadline:
                with eng.connect() as conn:
                    last = conn.execute(text("SELECT last_autoanalyze FROM pg_stat_user_tables "
                                             "WHERE relname = 'archive_documents'")).scalar()
                time.sleep(0.2)
            log = (cluster.data_dir.parent / "postgres.log").read_text(errors="replace")
            assert last is not None, log[-3000:]
            assert "archive_composed_text" not in log, log[-3000:]
            assert psql(cluster, "scrinalia", "SELECT count(*) FROM archive_documents") == "40"
        finally:
            eng.dispose()
