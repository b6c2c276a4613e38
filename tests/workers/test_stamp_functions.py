"""The stamp queues' predicates are SQL functions (migration 0009, decision 0095): the partial indexes are
built on them and the workers' queries call them, so the condition is written once and the planner still
reads the indexes."""
from __future__ import annotations

import re

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive.workers import cleaning, embedding, ner, quality, typology
from tests.workers.helpers import insert_docs

QUEUES = {
    "ix_documents_pending_embedding": (embedding.QUEUE, "archive_pending_embedding"),
    "ix_documents_pending_ner": (ner.QUEUE, "archive_pending_ner"),
    "ix_documents_pending_typology": (typology.QUEUE, "archive_pending_typology"),
    "ix_documents_pending_quality": (quality.QUEUE, "archive_pending_quality"),
    "ix_documents_pending_cleaning": (cleaning.QUEUE, "archive_pending_cleaning_text"),
}


def _index_defs(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'archive_documents'")).all())


def test_each_index_and_its_queue_call_the_same_function(engine):
    defs = _index_defs(engine)
    for index, (queue, function) in QUEUES.items():
        assert re.search(rf"WHERE (public\.)?{function}\(", defs[index]), defs[index]
        assert f"{function}(d." in queue.pending("d"), queue.pending("d")
    assert re.search(r"WHERE (public\.)?archive_has_stamp_error\(execution_log\)", defs["ix_documents_stamp_errors"])


def test_every_function_is_immutable_and_inlinable(engine):
    """Not STRICT and no SET clause: PostgreSQL inlines a SQL function only then (decision 0050)."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT proname, provolatile, proisstrict, proconfig FROM pg_proc "
            "WHERE proname LIKE 'archive_pending_%' OR proname IN ('archive_stamp_pending', "
            "'archive_has_stamp_error')")).all()
    assert len(rows) == 7
    assert all(r.provolatile == "i" and not r.proisstrict and r.proconfig is None for r in rows), rows


def test_the_failed_count_reads_the_error_index(engine):
    insert_docs(engine, [{"reference_code": f"E{i}", "title": f"t{i}"} for i in range(50)])
    with engine.begin() as conn:
        conn.execute(text("ANALYZE archive_documents"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(conn.execute(text(f"EXPLAIN SELECT {ner.QUEUE.failed_count_sql()}")).scalars())
    assert "ix_documents_stamp_errors" in plan, plan


@pytest.mark.parametrize("key", ["embedding", "quality-validator"])
def test_a_plugin_queue_without_a_function_of_its_own_uses_the_generic_one(engine, key):
    from scrinalia.domains.archive.workers.stamps import TITLE_STAMP_SQL, StampQueue

    queue = StampQueue(key, TITLE_STAMP_SQL, governed=False)
    assert queue.pending("d").startswith(f"archive_stamp_pending(d.execution_log, '{key}', md5(d.title))")
    insert_docs(engine, [{"reference_code": "P1", "title": "a"}])
    assert queue.pending_count(engine) == 1


def test_downgrade_restores_the_spelled_out_predicates_and_upgrade_the_functions(empty_database_url):
    before = ScriptDirectory.from_config(migrate.alembic_config(empty_database_url)).get_revision("0009").down_revision
    assert isinstance(before, str)
    migrate.upgrade(empty_database_url)
    eng = create_engine_from_url(empty_database_url)
    try:
        insert_docs(eng, [{"reference_code": f"M{i}", "title": f"t{i}", "status": "DRAFT"} for i in range(5)])
        counts = {index: queue.pending_count(eng) for index, (queue, _f) in QUEUES.items()}
        assert counts["ix_documents_pending_embedding"] == 5
        migrate.downgrade(empty_database_url, before)
        defs = _index_defs(eng)
        assert not any("archive_pending_" in d or "archive_has_stamp_error" in d for d in defs.values()), defs
        with eng.connect() as conn:
            functions = text("SELECT count(*) FROM pg_proc WHERE proname LIKE 'archive_pending_%'")
            assert conn.execute(functions).scalar() == 0
            old = conn.execute(text(
                "SELECT count(*) FROM archive_documents AS d WHERE (d.execution_log #>> '{embedding,stamp}') "
                "IS DISTINCT FROM archive_text_stamp(d.title, d.scope_and_content, d.admin_biographical_history, "
                "d.provenance)")).scalar()
        assert old == 5
        migrate.upgrade(empty_database_url)
        assert {index: queue.pending_count(eng) for index, (queue, _f) in QUEUES.items()} == counts
        assert "archive_pending_embedding" in _index_defs(eng)["ix_documents_pending_embedding"]
    finally:
        eng.dispose()
