"""The queue counts kept by the triggers of ``archive_documents`` (migration 0010, decision 0075) equal the
live counts after every kind of write: inserts, edits, approvals, deletes, a truncate, a bulk import,
rule changes, the workers' stamps (real runs) and concurrent writers that neither wait nor deadlock."""
from __future__ import annotations

import random
import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from scrinalia.api.catalogue_view import live_unit_counts, unit_counts
from scrinalia.domains.archive.demo import load_demo_collection
from scrinalia.domains.archive.importer import import_records
from scrinalia.domains.archive.workers import cleaning, quality, stamp_summary
from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.domains.archive.workers.stamps import reset_stamps
from tests.workers.helpers import insert_docs, run_worker, scalar

STATUSES = ("DRAFT", "PUBLISHED", "NEEDS_REVIEW", "HUMAN_APPROVED")


def assert_summary_is_live(engine) -> dict:
    catalogue = load_catalogue()
    served, live = unit_counts(engine, catalogue), live_unit_counts(engine, catalogue)
    assert served == live
    return served


def summary_rows(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM archive_stamp_counts")


def _records(n: int, prefix: str = "IMP") -> list[tuple[int, dict, None]]:
    return [(i + 1, {"reference_code": f"{prefix}/{i}", "title": f"Carta {i} sobre a camara",
                     "scope_and_content": f"Ambito {i}." if i % 2 else None, "date_text": str(1700 + i % 200),
                     "status": STATUSES[i % 4]}, None) for i in range(n)]


def _stamp(engine, key: str, where: str, status: str = "DONE") -> None:
    """Stamp ``key`` as a worker would (the current stamp), for the documents matching ``where``."""
    queue = load_catalogue()[key].queue
    with engine.begin() as conn:
        conn.execute(text(
            f"UPDATE archive_documents AS d SET execution_log = jsonb_set(d.execution_log, ARRAY[CAST(:k AS text)], "
            f"jsonb_build_object('stamp', {queue.stamp('d')}, 'status', CAST(:s AS text), 'run_id', 'test')) "
            f"WHERE {where}"), {"k": key, "s": status})


def test_every_queue_of_the_catalogue_is_summarised():
    """The triggers encode the catalogue's queues; a queue changed in stamps.py or a worker (and not in a
    migration) would fall back to a live count: this says so first."""
    queues = {name: spec.queue for name, spec in load_catalogue().items() if getattr(spec, "queue", None)}
    assert queues and all(stamp_summary.summarised(q) for q in queues.values()), queues


def test_the_migration_counts_what_is_there_and_the_route_reads_the_summary(engine, database_url):
    """Rows present before migration 0010 are counted by its backfill (a downgrade to 0007 and back)."""
    from scrinalia.db import migrate

    load_demo_collection(engine)
    _stamp(engine, "embedding", "d.id % 2 = 0")
    migrate.downgrade(database_url, "0007")
    _stamp(engine, "ner", "d.id % 3 = 0", status="ERROR")  # unseen by any trigger
    migrate.upgrade(database_url)
    counts = assert_summary_is_live(engine)
    assert counts["ner"]["failed"] > 0 and counts["embedding"]["pending"] > 0
    assert counts["gpu-probe"] == {"pending": None, "processed": None, "failed": None}


def test_inserts_edits_approvals_deletes_and_truncate(engine):
    ids = insert_docs(engine, [{"reference_code": f"D{i}", "title": f"Documento {i}", "status": STATUSES[i % 4],
                                "scope_and_content": "x" if i % 3 else None} for i in range(40)])
    first = assert_summary_is_live(engine)
    assert first["embedding"]["pending"] == 40 and first["ner"]["pending"] == 30  # 10 approved
    for key in ("embedding", "ner", "typology"):
        _stamp(engine, key, "d.id % 4 <> 0")
    _stamp(engine, "typology", "d.id % 5 = 0", status="ERROR")
    _stamp(engine, "quality-validator", "d.id % 2 = 0")  # after ner/typology: its stamp reads their run ids
    assert_summary_is_live(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET title = title || ' (revisto)' WHERE id % 7 = 0"))
        conn.execute(text("UPDATE archive_documents SET status = 'HUMAN_APPROVED' WHERE id % 6 = 1"))
        conn.execute(text("UPDATE archive_documents SET status = 'DRAFT' WHERE id % 8 = 3"))
        conn.execute(text("UPDATE archive_documents SET is_anomaly = true, updated_at = now()"))  # no count changes
    assert_summary_is_live(engine)
    with engine.begin() as conn:  # text, record and governance at once; a row that gets a new id (no partner)
        conn.execute(text("UPDATE archive_documents SET provenance = 'P' || id, status = 'PUBLISHED', "
                          "execution_log = execution_log - 'ner' WHERE id % 3 = 2"))
        conn.execute(text("UPDATE archive_documents SET id = DEFAULT, title = title || '.' WHERE id % 5 = 0"))
    assert_summary_is_live(engine)
    with engine.connect() as conn:
        ids = list(conn.execute(text("SELECT id FROM archive_documents ORDER BY id")).scalars())
    before = summary_rows(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET is_anomaly = false, anomaly_reasons = '[\"x\"]'"))
    assert summary_rows(engine) == before  # an UPDATE that changes no state writes no delta
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_documents WHERE id = ANY(:ids)"), {"ids": ids[:9]})
    assert_summary_is_live(engine)
    with pytest.raises(RuntimeError), engine.begin() as conn:  # a rolled-back write leaves no trace
        conn.execute(text("DELETE FROM archive_documents"))
        raise RuntimeError("roll back")
    assert_summary_is_live(engine)
    reset_stamps(engine, "embedding")
    assert assert_summary_is_live(engine)["embedding"]["pending"] == 31
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE archive_documents CASCADE"))
    assert assert_summary_is_live(engine)["embedding"] == {"pending": 0, "failed": 0, "processed": 0}
    assert summary_rows(engine) == 0


def test_a_bulk_import_is_one_set_based_write_per_statement(engine):
    report = import_records(engine, _records(600))
    assert report.inserted == 600
    # one INSERT of 600 documents added one row per state group, not one per document
    groups = summary_rows(engine)
    assert groups <= 5 * 2 * 2, groups
    assert assert_summary_is_live(engine)["typology"]["pending"] == 450
    changed = [(line, {**rec, "title": rec["title"].upper(), "status": STATUSES[(line + 1) % 4]}, None)
               for line, rec, _ in _records(600)]
    assert import_records(engine, changed, on_conflict="update").updated == 600
    assert_summary_is_live(engine)


def test_cleaning_rules_change_the_counts_without_a_rewrite(engine):
    insert_docs(engine, [{"reference_code": f"C{i}", "title": f"Titulo  {i}.", "status": STATUSES[i % 4]}
                         for i in range(20)])
    assert assert_summary_is_live(engine)["cleaning"]["pending"] == 0  # no active rule: nothing pending
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))
    assert assert_summary_is_live(engine)["cleaning"]["pending"] == 15
    rows_before = summary_rows(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('dots', 'REWRITE', 'title', '\\.+$', '')"))
        conn.execute(text("UPDATE archive_cleaning_rules SET active = false WHERE name = 'spaces'"))
    assert summary_rows(engine) == rows_before  # a rule change writes nothing to the summary
    assert assert_summary_is_live(engine)["cleaning"]["pending"] == 15


def test_real_worker_runs_stamp_and_the_counts_follow(database_url, engine):
    """cleaning (one statement per document) and quality-validator (stamps, flags, statuses) in real
    one-shot children; then an edit re-queues."""
    load_demo_collection(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))
    for spec in (cleaning.SPEC, quality.SPEC):
        status, result, run = run_worker(database_url, engine, spec, {})
        assert status == "SUCCESS", run.error
        assert result.get("units", 0) > 0, result
    counts = assert_summary_is_live(engine)
    assert counts["cleaning"]["pending"] == 0 and counts["quality-validator"]["pending"] == 0
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET title = title || '  x' WHERE id % 10 = 0"))
    counts = assert_summary_is_live(engine)
    assert counts["cleaning"]["pending"] > 0 and counts["quality-validator"]["pending"] > 0


def test_concurrent_writers_neither_wait_nor_deadlock(engine):
    """A long open transaction that wrote documents (and folded the summary) does not hold up another
    writer of the same states: with lock_timeout 2 s the second one still commits at once."""
    insert_docs(engine, [{"reference_code": f"W{i}", "title": f"T {i}"} for i in range(100)])
    long = engine.connect()
    try:
        long.begin()
        long.execute(text("UPDATE archive_documents SET title = title || '!' WHERE id % 2 = 0"))
        assert long.execute(text("SELECT archive_stamp_counts_fold()")).scalar_one() >= 0  # holds the fold
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))
            for i in range(70):  # enough rows to reach a fold: it is skipped, not waited for
                conn.execute(text("UPDATE archive_documents SET title = title || '?' WHERE id = :i"), {"i": 2 * i + 1})
            conn.execute(text("INSERT INTO archive_documents (reference_code, title) VALUES ('W-new', 'novo')"))
        assert_summary_is_live(engine)  # the long transaction's writes are not visible yet, nor counted
        long.commit()
    finally:
        long.close()
    assert_summary_is_live(engine)


def test_many_writers_at_once_keep_the_summary_exact(engine):
    """Four threads of random single- and multi-row writes (one in REPEATABLE READ), with folds
    happening as they go; then the summary equals the live count and stays a few dozen rows."""
    insert_docs(engine, [{"reference_code": f"M{i}", "title": f"Livro {i}", "status": STATUSES[i % 4]}
                         for i in range(200)])
    errors: list[BaseException] = []
    queue = load_catalogue()["embedding"].queue

    def writer(seed: int, isolation: str) -> None:
        rnd = random.Random(seed)
        eng = engine.execution_options(isolation_level=isolation)
        try:
            for step in range(60):
                a = rnd.randrange(200)
                with eng.begin() as conn:
                    choice = rnd.randrange(5)
                    if choice == 0:
                        conn.execute(text("UPDATE archive_documents SET title = title || 'x' WHERE id % 200 = :a"),
                                     {"a": a})
                    elif choice == 1:
                        conn.execute(text(
                            f"UPDATE archive_documents AS d SET execution_log = jsonb_set(d.execution_log, "
                            f"'{{embedding}}', jsonb_build_object('stamp', {queue.stamp('d')}, 'status', "
                            f"CASE WHEN d.id % 3 = 0 THEN 'ERROR' ELSE 'DONE' END)) WHERE d.id % 17 = :m"),
                            {"m": a % 17})
                    elif choice == 2:
                        conn.execute(text("UPDATE archive_documents SET status = CAST(:s AS document_status) "
                                          "WHERE id % 50 = :a"), {"s": STATUSES[a % 4], "a": a % 50})
                    elif choice == 3:
                        conn.execute(text("INSERT INTO archive_documents (reference_code, title) "
                                          "VALUES (:r, 'novo')"), {"r": f"N{seed}-{step}"})
                    else:
                        conn.execute(text("DELETE FROM archive_documents WHERE reference_code = :r"),
                                     {"r": f"N{seed}-{step - 1}"})
        except DBAPIError as exc:  # a serialization failure of the REPEATABLE READ writer is its own, retried
            if "could not serialize" not in str(exc):
                errors.append(exc)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed, iso)) for seed, iso in
               enumerate(("READ COMMITTED", "READ COMMITTED", "READ COMMITTED", "REPEATABLE READ"))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads), f"writers still running after {time.monotonic() - start:.0f} s"
    assert_summary_is_live(engine)
    stamp_summary.fold(engine)
    assert summary_rows(engine) <= 5 * 2 * 2 * 2 + 5
    assert_summary_is_live(engine)
    # a recompute from the documents gives the same answer
    stamp_summary.recompute(engine)
    assert_summary_is_live(engine)


def test_the_cli_checks_and_repairs_the_summary(database_url, engine, monkeypatch):
    from click.testing import CliRunner

    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    insert_docs(engine, [{"reference_code": f"K{i}", "title": f"Livro {i}"} for i in range(5)])
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        ok = CliRunner().invoke(cli, ["archive", "queues", "--check"])
        assert ok.exit_code == 0, ok.output
        assert "the panel's counts (archive_stamp_counts) equal these" in ok.output
        with engine.begin() as conn:  # a write the triggers did not see
            conn.execute(text("ALTER TABLE archive_documents DISABLE TRIGGER archive_stamp_counts_delete"))
            conn.execute(text("DELETE FROM archive_documents WHERE reference_code = 'K0'"))
            conn.execute(text("ALTER TABLE archive_documents ENABLE TRIGGER archive_stamp_counts_delete"))
        bad = CliRunner().invoke(cli, ["archive", "queues", "--check"])
        assert bad.exit_code == 1 and "differ from the documents'" in bad.output, bad.output
        fixed = CliRunner().invoke(cli, ["archive", "queues", "--repair"])
        assert fixed.exit_code == 0 and "rebuilt from the documents" in fixed.output, fixed.output
    finally:
        get_settings.cache_clear()
    assert_summary_is_live(engine)


def test_queue_counts_by_the_definitions_of_the_queue():
    """pending / failed / processed from the summary's groups, without a database: other keys and (for a
    governed queue) ungoverned documents do not count; a per-rule queue is pending on a stale group or
    another rule set, and on nothing while no rule set is active; failed is never pending too."""
    from scrinalia.domains.archive.workers.stamp_summary import SUMMARISED, CountGroup, queue_counts

    groups = [
        CountGroup("ner", governed=True, stale=False, failed=False, ruleset="r1", n=10),
        CountGroup("ner", governed=True, stale=True, failed=True, ruleset="r1", n=3),   # pending, not failed
        CountGroup("ner", governed=True, stale=False, failed=True, ruleset="r1", n=2),
        CountGroup("ner", governed=False, stale=True, failed=False, ruleset="r1", n=100),
        CountGroup("embedding", governed=False, stale=True, failed=False, ruleset="r1", n=7),
        CountGroup("embedding", governed=True, stale=False, failed=True, ruleset="r1", n=1),
        CountGroup("cleaning", governed=True, stale=False, failed=False, ruleset="r1", n=4),
        CountGroup("cleaning", governed=True, stale=False, failed=True, ruleset="r0", n=5),
        CountGroup("cleaning", governed=True, stale=True, failed=False, ruleset="r1", n=6),
    ]
    assert queue_counts(SUMMARISED["ner"], groups, "r1") == {"pending": 3, "failed": 2, "processed": 10}
    assert queue_counts(SUMMARISED["embedding"], groups, "r1") == {"pending": 7, "failed": 1, "processed": 0}
    assert queue_counts(SUMMARISED["cleaning"], groups, "r1") == {"pending": 11, "failed": 0, "processed": 4}
    assert queue_counts(SUMMARISED["cleaning"], groups, None) == {"pending": 0, "failed": 5, "processed": 10}
    assert queue_counts(SUMMARISED["typology"], groups, "r1") == {"pending": 0, "failed": 0, "processed": 0}
    negative = [CountGroup("ner", governed=True, stale=True, failed=False, ruleset="r1", n=1),
                CountGroup("ner", governed=True, stale=False, failed=False, ruleset="r1", n=-4)]
    assert queue_counts(SUMMARISED["ner"], negative, "r1") == {"pending": 1, "failed": 0, "processed": 0}
