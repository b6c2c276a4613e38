"""The stamp queues (one condition for the execution and the count, index-backed), the import and the demo."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from scrinalia.domains.archive.demo import load_demo_collection
from scrinalia.domains.archive.importer import ImportFailed, import_file
from scrinalia.domains.archive.workers import cleaning, embedding, ner, quality, typology
from tests.workers.helpers import insert_docs, scalar


@pytest.mark.parametrize(("spec", "index"), [
    (embedding.SPEC, "ix_documents_pending_embedding"),
    (ner.SPEC, "ix_documents_pending_ner"),
    (typology.SPEC, "ix_documents_pending_typology"),
    (quality.SPEC, "ix_documents_pending_quality"),
])
def test_the_pending_condition_is_the_predicate_of_a_partial_index(engine, spec, index):
    insert_docs(engine, [{"reference_code": f"R{i}", "title": f"t{i}"} for i in range(50)])
    with engine.begin() as conn:
        conn.execute(text("ANALYZE archive_documents"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(conn.execute(text(
            f"EXPLAIN SELECT count(*) FROM archive_documents AS d WHERE {spec.queue.pending('d')}")).scalars())
        fetch = "\n".join(conn.execute(text("EXPLAIN " + str(spec.queue.fetch_sql("d.title"))),
                                       {"after": 0, "limit": 10}).scalars())
    assert index in plan, plan
    assert index in fetch, fetch


def _plans(engine, queue):
    """The count's and the fetch's plans, each under the queue's own planner settings."""
    out = []
    for sql, params, fetch in ((f"SELECT {queue.pending_count_sql()}", {}, False),
                               (str(queue.fetch_sql("d.title")), {"after": 0, "limit": 10}, True)):
        with engine.begin() as conn:
            queue.prepare(conn, fetch=fetch)
            out.append("\n".join(conn.execute(text("EXPLAIN " + sql), params).scalars()))
    return out


def test_the_cleaning_queue_reads_two_indexes_whether_nothing_or_everything_is_pending(engine):
    """Decision 0027: the count and the fetch read ix_documents_pending_cleaning and
    ix_documents_cleaning_ruleset, never a sequential scan, with nothing pending and after a rule edit."""
    from scrinalia.domains.archive.workers.stamps import CLEANING_TEXT_STAMP_SQL

    with engine.begin() as conn:  # enough rows for the planner to weigh its options as on a real archive
        conn.execute(text("INSERT INTO archive_documents (reference_code, title, scope_and_content, status) "
                          "SELECT 'R' || g, 'Title ' || g, repeat('Scope and content. ', 10), CAST(CASE WHEN "
                          "g % 10 = 0 THEN 'HUMAN_APPROVED' ELSE 'DRAFT' END AS document_status) "
                          "FROM generate_series(1, 5000) AS g"))
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))
        conn.execute(text(f"UPDATE archive_documents AS d SET cleaning_ruleset = archive_cleaning_ruleset(), "
                          f"cleaning_text_stamp = {CLEANING_TEXT_STAMP_SQL.format(a='d')} "
                          "WHERE status <> 'HUMAN_APPROVED'"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE archive_documents"))  # the visibility map, as autovacuum keeps it
    for state, pending in (("nothing pending", 0), ("a rule changed", 4500)):
        assert cleaning.SPEC.pending_count(engine) == pending, state
        count, fetch = _plans(engine, cleaning.QUEUE)
        for plan in (count, fetch):
            assert "ix_documents_pending_cleaning" in plan and "ix_documents_cleaning_ruleset" in plan, (state, plan)
            assert "Seq Scan" not in plan, (state, plan)
        # the count never evaluates the text stamp row by row; the fetch is one BitmapOr of the two indexes
        assert not [line for line in count.splitlines() if "Filter" in line and "md5" in line], (state, count)
        assert "BitmapOr" in fetch, (state, fetch)
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_cleaning_rules SET replacement = '  '"))


def test_composed_text_and_its_stamp_are_computed_by_postgresql(engine):
    insert_docs(engine, [{"reference_code": "X", "title": " Title ", "scope_and_content": "Scope",
                          "admin_biographical_history": "  ", "provenance": "Prov"}])
    composed = scalar(engine, "SELECT archive_composed_text(title, scope_and_content, admin_biographical_history, "
                              "provenance) FROM archive_documents")
    assert composed == "Title\n\nScope\n\nProv"
    assert scalar(engine, "SELECT archive_text_stamp(title, scope_and_content, admin_biographical_history, "
                          "provenance) = md5(:c) FROM archive_documents", c=composed)


def test_counts_split_pending_processed_failed_and_respect_governance(engine):
    ids = insert_docs(engine, [{"reference_code": f"S{i}", "title": f"t{i}"} for i in range(5)]
                      + [{"reference_code": "SA", "title": "approved", "status": "HUMAN_APPROVED"}])
    with engine.begin() as conn:
        for i, status in ((ids[0], "DONE"), (ids[1], "ERROR")):
            conn.execute(text("""UPDATE archive_documents SET execution_log = jsonb_build_object('ner',
                jsonb_build_object('stamp', archive_text_stamp(title, scope_and_content, admin_biographical_history,
                provenance), 'status', CAST(:s AS text))) WHERE id = :i"""), {"s": status, "i": i})
    assert ner.SPEC.counts(engine) == {"pending": 3, "processed": 1, "failed": 1}
    assert embedding.SPEC.counts(engine) == {"pending": 6, "processed": 0, "failed": 0}
    assert cleaning.SPEC.counts(engine) == {"pending": 0, "processed": 5, "failed": 0}


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


def test_import_jsonl_and_csv(engine, tmp_path):
    jsonl = _write(tmp_path, "a.jsonl", "\n".join(json.dumps(d) for d in [
        {"reference_code": "J1", "title": "One", "date_start": "1750", "date_end": "1751-03"},
        {"reference_code": "J2", "title": "Two", "status": "PUBLISHED", "level": "file"},
    ]) + "\n\n")
    report = import_file(engine, jsonl)
    assert report.inserted == 2
    assert str(scalar(engine, "SELECT date_end FROM archive_documents WHERE reference_code = 'J1'")) == "1751-03-31"
    csv_file = _write(tmp_path, "b.csv", 'reference_code,title,scope_and_content\nC1,"A, quoted title","multi\nline"\n'
                                         "C2,Second,\n")
    assert import_file(engine, csv_file).inserted == 2
    c1 = "SELECT scope_and_content FROM archive_documents WHERE reference_code = 'C1'"
    assert scalar(engine, c1) == "multi\nline"
    assert import_file(engine, jsonl, on_conflict="skip").skipped == 2
    with pytest.raises(ImportFailed) as caught:
        import_file(engine, jsonl)
    assert [e.line for e in caught.value.errors] == [1, 2]


def test_import_reports_every_bad_line_and_imports_nothing(engine, tmp_path):
    bad = _write(tmp_path, "bad.jsonl", "\n".join([
        json.dumps({"reference_code": "OK1", "title": "fine"}),
        "{not json",
        json.dumps({"reference_code": "B3"}),
        json.dumps({"reference_code": "B4", "title": "x", "date_start": "1750-13-01"}),
        json.dumps({"reference_code": "B5", "title": "x", "colour": "red"}),
        json.dumps({"reference_code": "OK1", "title": "again"}),
        json.dumps({"reference_code": "B7", "title": "x", "date_start": "1800", "date_end": "1700"}),
        json.dumps({"reference_code": "B8", "title": "x", "status": "LOST"}),
        json.dumps(["not", "an", "object"]),
    ]))
    with pytest.raises(ImportFailed) as caught:
        import_file(engine, bad)
    lines = {e.line: e.message for e in caught.value.errors}
    assert sorted(lines) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert "invalid JSON" in lines[2] and "title: is required" in lines[3] and "date_start" in lines[4]
    assert "colour" in lines[5] and "repeated (first on line 1)" in lines[6] and "before" in lines[7]
    assert "status" in lines[8]
    assert scalar(engine, "SELECT count(*) FROM archive_documents") == 0  # nothing half-imported

    bad_csv = _write(tmp_path, "bad.csv", "reference_code,title\nK1,fine\nK2\nK3,x,extra\n,no code\n")
    with pytest.raises(ImportFailed) as caught:
        import_file(engine, bad_csv)
    assert [e.line for e in caught.value.errors] == [3, 4, 5]
    assert scalar(engine, "SELECT count(*) FROM archive_documents") == 0


def test_the_cli_import_command(database_url, engine, tmp_path, monkeypatch):
    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        good = _write(tmp_path, "good.jsonl", json.dumps({"reference_code": "Z1", "title": "z"}) + "\n")
        out = CliRunner().invoke(cli, ["archive", "import", str(good)])
        assert out.exit_code == 0 and "imported 1 new" in out.output
        bad = _write(tmp_path, "bad.csv", "reference_code,title\nZ2,ok\nZ3,\n")
        out = CliRunner().invoke(cli, ["archive", "import", str(bad)])
        assert out.exit_code == 1
        assert "bad.csv:3: title: is required" in out.output and "nothing was imported" in out.output
        assert scalar(engine, "SELECT count(*) FROM archive_documents") == 1
    finally:
        get_settings.cache_clear()


def test_the_demo_collection_loads_once_and_has_flaws_to_find(engine):
    assert 190 <= load_demo_collection(engine) <= 220
    assert load_demo_collection(engine) == 0
    assert scalar(engine, "SELECT count(DISTINCT left(reference_code, 10)) FROM archive_documents") >= 10
    assert scalar(engine, "SELECT count(*) FROM archive_documents WHERE title = upper(title)") >= 2
    assert scalar(engine, "SELECT count(*) FROM archive_documents WHERE date_start IS NULL") >= 2
    assert scalar(engine, "SELECT count(*) FROM archive_typologies WHERE active") >= 5


def test_the_quality_validator_finds_the_demo_collections_flaws(database_url, engine):
    from tests.workers.helpers import rows, run_worker

    load_demo_collection(engine)
    status, result, run = run_worker(database_url, engine, quality.SPEC, {})
    assert status == "SUCCESS", run.error
    flagged = {r.reference_code: {x["code"] for x in r.anomaly_reasons} for r in rows(
        engine, "SELECT reference_code, anomaly_reasons FROM archive_documents WHERE is_anomaly")}
    assert flagged["PT/SCR/FLW/0001"] >= {"title_all_caps"}
    assert flagged["PT/SCR/FLW/0003"] >= {"title_template"}
    assert flagged["PT/SCR/FLW/0004"] >= {"title_repeated_words"}
    assert flagged["PT/SCR/FLW/0005"] >= {"date_missing", "title_duplicate"}
    assert flagged["PT/SCR/FLW/0007"] >= {"date_future"}
    assert flagged["PT/SCR/FLW/0008"] >= {"title_template", "validate_rule"}
    assert len(flagged) < 40  # the realistic descriptions are mostly clean


def test_catalogue_counts_in_one_statement_agree_with_each_queue(engine):
    from scrinalia.domains.archive.workers.plugins import load_catalogue
    from scrinalia.domains.archive.workers.stamps import catalogue_counts

    load_demo_collection(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET execution_log = jsonb_build_object('typology', "
                          "jsonb_build_object('stamp', md5(title), 'status', 'ERROR')) WHERE id % 3 = 0"))
    catalogue = load_catalogue()
    together = catalogue_counts(engine, catalogue)
    assert together == {name: spec.counts(engine) for name, spec in catalogue.items()}
    assert together["gpu-probe"] is None and together["typology"]["failed"] > 0


def test_the_cli_queues_command(database_url, engine, monkeypatch):
    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    insert_docs(engine, [{"reference_code": "Q1", "title": "one"}])
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(cli, ["archive", "queues"])
    finally:
        get_settings.cache_clear()
    assert out.exit_code == 0, out.output
    assert "embedding" in out.output and "pending        1" in out.output and "gpu-probe" in out.output
