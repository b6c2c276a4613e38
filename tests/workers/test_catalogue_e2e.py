"""Every worker end to end through a real runner child (``runner.oneshot.run_once``) on PostgreSQL."""
from __future__ import annotations

import json
import math

import pytest
from sqlalchemy import text

from scrinalia.domains.archive.workers import cleaning, embedding, gpu_probe, ner, quality, typology
from scrinalia.domains.archive.workers.stamps import reset_stamps
from tests.workers.helpers import insert_docs, rows, run_worker, scalar, stamps
from tests.workers.tiny_models import NLI_KEYWORDS

pytestmark = pytest.mark.slow


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embedding_with_the_real_minilm_and_its_stamps(database_url, engine):
    titles = {
        "A1": "Letters of the bishop to the cathedral chapter",
        "A2": "Correspondence between the bishop and the canons of the cathedral",
        "B1": "Map of the river harbour and the new road",
        "B2": "Plan of the port and the river docks",
        "C": "Accounts of the hospital pharmacy: purchases of medicines",
    }
    insert_docs(engine, [{"reference_code": k, "title": v} for k, v in titles.items()]
                + [{"reference_code": "EMPTY", "title": "  "}])
    assert embedding.SPEC.pending_count(engine) == 6

    status, result, run = run_worker(database_url, engine, embedding.SPEC, {"db_batch_size": 4, "preset": "cpu"})
    assert status == "SUCCESS", run.error
    assert result["units"] == 6 and result["embedded"] == 5 and result["empty"] == 1
    assert result["model"] == "all-MiniLM-L6-v2" and result["dimensions"] == 384
    assert run.engine_name == "transformers" and run.preset == "cpu" and run.config["device"] == "cpu"
    vec = {r.reference_code: list(r.vector) for r in rows(engine, """
        SELECT d.reference_code, e.vector FROM archive_document_embeddings e
          JOIN archive_documents d ON d.id = e.document_id""")}
    assert set(vec) == set(titles)
    for v in vec.values():
        assert math.isclose(math.sqrt(_cos(v, v)), 1.0, abs_tol=1e-3)
    # titles close in meaning lie nearer to each other than unrelated ones
    assert _cos(vec["A1"], vec["A2"]) > max(_cos(vec["A1"], vec["B1"]), _cos(vec["A1"], vec["B2"]),
                                            _cos(vec["A1"], vec["C"]))
    assert _cos(vec["B1"], vec["B2"]) > max(_cos(vec["B1"], vec["A2"]), _cos(vec["B1"], vec["C"]))

    first = stamps(engine, "embedding")
    assert all(s["status"] == "DONE" for k, s in first.items() if k != "EMPTY")
    assert first["EMPTY"]["status"] == "ERROR" and first["EMPTY"]["error"].startswith("EmptyText")
    # the stamp is PostgreSQL's md5 of the composed text
    assert first["A1"]["stamp"] == scalar(engine, "SELECT md5(:t)", t=titles["A1"])
    assert embedding.SPEC.counts(engine) == {"pending": 0, "processed": 5, "failed": 1}
    updated = scalar(engine, "SELECT max(updated_at) FROM archive_document_embeddings")

    # a second run touches nothing already stamped
    status, result, _ = run_worker(database_url, engine, embedding.SPEC, {"preset": "cpu"})
    assert status == "SUCCESS" and result["pending_at_start"] == 0 and result.get("units", 0) == 0
    assert stamps(engine, "embedding") == first
    assert scalar(engine, "SELECT max(updated_at) FROM archive_document_embeddings") == updated

    # editing a document's text puts it back in the queue, by itself
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET scope_and_content = 'Forty letters, 1750.' "
                          "WHERE reference_code = 'A1'"))
    assert embedding.SPEC.pending_count(engine) == 1
    status, result, _ = run_worker(database_url, engine, embedding.SPEC, {"preset": "cpu"})
    assert status == "SUCCESS" and result["units"] == 1
    after = stamps(engine, "embedding")
    assert after["A1"]["stamp"] != first["A1"]["stamp"]
    assert {k: v for k, v in after.items() if k != "A1"} == {k: v for k, v in first.items() if k != "A1"}
    assert embedding.SPEC.pending_count(engine) == 0


def test_ner_upserts_entities_and_links_and_honours_filters(database_url, engine, ner_model_dir):
    ids = insert_docs(engine, [
        {"reference_code": "N1", "title": "Letters of Maria Joaquina to the Camara Municipal de Lisboa"},
        {"reference_code": "N2", "title": "Carta de Pedro Alvares", "scope_and_content": "Lisboa and Braga."},
        {"reference_code": "N3", "title": "Deeds of the Confraria in Coimbra", "status": "HUMAN_APPROVED"},
        {"reference_code": "N4", "title": "Minutes of the concilio"},
    ])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_entity_stopwords (term) VALUES ('BRAGA')"))
        conn.execute(text("INSERT INTO archive_entity_exclusions (label, term) VALUES ('MISC', 'concilio')"))
    assert ner.SPEC.pending_count(engine) == 3  # HUMAN_APPROVED is not ner's to touch
    request = {"engine_options": {"model": ner_model_dir}, "preset": "cpu", "db_batch_size": 2}
    status, result, run = run_worker(database_url, engine, ner.SPEC, request)
    assert status == "SUCCESS", run.error
    assert result["units"] == 3
    entities = {(r.label, r.name) for r in rows(engine, "SELECT label, name FROM archive_entities")}
    assert entities == {("PER", "Maria Joaquina"), ("ORG", "Camara Municipal"), ("LOC", "Lisboa"),
                        ("PER", "Pedro Alvares")}
    links = {(r.reference_code, r.name, r.mentions) for r in rows(engine, """
        SELECT d.reference_code, e.name, l.mentions FROM archive_document_entities l
          JOIN archive_documents d ON d.id = l.document_id JOIN archive_entities e ON e.id = l.entity_id""")}
    assert links == {("N1", "Maria Joaquina", 1), ("N1", "Camara Municipal", 1), ("N1", "Lisboa", 1),
                     ("N2", "Pedro Alvares", 1), ("N2", "Lisboa", 1)}
    s = stamps(engine, "ner")
    assert s["N3"] is None and s["N4"]["status"] == "DONE"
    assert scalar(engine, "SELECT count(*) FROM archive_document_entities WHERE document_id = :i", i=ids[2]) == 0

    # a second run touches nothing; an edited text is re-analysed and its links replaced
    status, result, _ = run_worker(database_url, engine, ner.SPEC, request)
    assert status == "SUCCESS" and result.get("units", 0) == 0 and stamps(engine, "ner") == s
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET scope_and_content = NULL WHERE reference_code = 'N2'"))
    status, result, _ = run_worker(database_url, engine, ner.SPEC, request)
    assert result["units"] == 1
    assert {r.name for r in rows(engine, """SELECT e.name FROM archive_document_entities l
        JOIN archive_entities e ON e.id = l.entity_id WHERE l.document_id = :i""", i=ids[1])} == {"Pedro Alvares"}


def _typologies(engine, *names, inactive=()):
    with engine.begin() as conn:
        for n in names:
            conn.execute(text("INSERT INTO archive_typologies (name) VALUES (:n)"), {"n": n})
        for n in inactive:
            conn.execute(text("INSERT INTO archive_typologies (name, active) VALUES (:n, false)"), {"n": n})


def test_typology_links_what_reaches_the_threshold(database_url, engine, nli_model_dir):
    insert_docs(engine, [{"reference_code": f"T{i}", "title": t} for i, t in enumerate(
        ["Letters of the council", "Map survey of the parish", "Register of deeds"])]
        + [{"reference_code": "TA", "title": "Approved letters", "status": "HUMAN_APPROVED"}])
    request = {"engine_name": "transformers-zero-shot", "engine_options": {"model": nli_model_dir},
               "db_batch_size": 2}
    # no active typology: nothing is stamped, the documents stay pending for when there are some
    status, result, _ = run_worker(database_url, engine, typology.SPEC, request)
    assert status == "SUCCESS" and result["typologies"] == 0 and typology.SPEC.pending_count(engine) == 3

    # the tiny NLI model scores every hypothesis alike: with two active typologies each gets 0.5 (>= 0.40)
    _typologies(engine, *list(NLI_KEYWORDS)[:2], inactive=["cartography"])
    status, result, run = run_worker(database_url, engine, typology.SPEC, request)
    assert status == "SUCCESS", run.error
    assert result["units"] == 3 and result["links"] == 6
    scores = rows(engine, "SELECT t.name, l.score FROM archive_document_typologies l "
                          "JOIN archive_typologies t ON t.id = l.typology_id")
    assert {r.name for r in scores} == {"correspondence", "minutes"}
    assert all(math.isclose(r.score, 0.5, abs_tol=1e-4) for r in scores)
    assert stamps(engine, "typology")["TA"] is None

    # a third active typology puts every score at 1/3, under the threshold: an edited title loses its links
    _typologies(engine, "register")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET title = 'Letters of the bishop' WHERE reference_code = 'T0'"))
    status, result, _ = run_worker(database_url, engine, typology.SPEC, request)
    assert result["units"] == 1 and result["links"] == 0
    assert scalar(engine, """SELECT count(*) FROM archive_document_typologies l JOIN archive_documents d
                             ON d.id = l.document_id WHERE d.reference_code = 'T0'""") == 0


def test_typology_runs_with_no_model_configured_by_embedding_similarity(database_url, engine):
    """A fresh install: no NLI model anywhere; the default engine is the bundled MiniLM's similarity."""
    insert_docs(engine, [
        {"reference_code": "L", "title": "Letters from the bishop to his nephew, 1821-1830"},
        {"reference_code": "M", "title": "Map of the river harbour and the new road"},
    ])
    with engine.begin() as conn:
        for name, description in [("correspondence", "letters sent or received"),
                                  ("cartography", "maps, plans and surveys of places")]:
            conn.execute(text("INSERT INTO archive_typologies (name, description) VALUES (:n, :d)"),
                         {"n": name, "d": description})
    status, result, run = run_worker(database_url, engine, typology.SPEC, {"preset": "cpu"})
    assert status == "SUCCESS", run.error
    assert run.engine_name == "embedding-similarity" and result["model"] == "all-MiniLM-L6-v2 (similarity)"
    links = {r.reference_code: (r.name, r.score) for r in rows(engine, """
        SELECT d.reference_code, t.name, l.score FROM archive_document_typologies l
          JOIN archive_documents d ON d.id = l.document_id JOIN archive_typologies t ON t.id = l.typology_id""")}
    assert links["L"][0] == "correspondence" and links["M"][0] == "cartography"
    assert all(0.4 <= score <= 1.0 for _, score in links.values())


def test_quality_validator_flags_anomalies_and_fills_the_review_queue(database_url, engine, nli_model_dir):
    insert_docs(engine, [
        {"reference_code": "Q-ok", "title": "Letters of the bishop of Lamego", "date_text": "1820",
         "date_start": "1820-01-01", "date_end": "1820-12-31", "status": "PUBLISHED"},
        {"reference_code": "Q-caps", "title": "REGISTO DE TESTAMENTOS", "date_start": "1701-01-01"},
        {"reference_code": "Q-nodate", "title": "Plan of the cemetery"},
        {"reference_code": "Q-future", "title": "Digitisation plan", "date_start": "2099-01-01"},
        {"reference_code": "Q-template", "title": "Untitled", "date_text": "s.d."},
        {"reference_code": "Q-dup1", "title": "Letters of the priest", "date_text": "1799"},
        {"reference_code": "Q-dup2", "title": "letters of the priest ", "date_text": "1800"},
        {"reference_code": "Q-lorem", "title": "Record of the the survey", "date_text": "1900",
         "scope_and_content": "Lorem ipsum dolor."},
        {"reference_code": "Q-approved", "title": "ALL CAPS BUT APPROVED", "status": "HUMAN_APPROVED"},
    ])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, message) VALUES "
                          "('lorem', 'VALIDATE', 'scope_and_content', '(?i)lorem ipsum', 'placeholder text')"))
    status, result, run = run_worker(database_url, engine, quality.SPEC, {"db_batch_size": 3})
    assert status == "SUCCESS", run.error
    assert run.engine_name is None and run.config["llm_check_rule"] is None
    found = {r.reference_code: (r.is_anomaly, {x["code"] for x in r.anomaly_reasons}, r.status)
             for r in rows(engine, "SELECT reference_code, is_anomaly, anomaly_reasons, status FROM archive_documents")}
    assert found["Q-ok"] == (False, set(), "PUBLISHED")
    assert found["Q-caps"] == (True, {"title_all_caps"}, "NEEDS_REVIEW")
    assert found["Q-nodate"] == (True, {"date_missing"}, "NEEDS_REVIEW")
    assert found["Q-future"] == (True, {"date_future"}, "NEEDS_REVIEW")
    assert found["Q-template"][1] == {"title_template"}
    assert found["Q-dup1"][1] == {"title_duplicate"} and found["Q-dup2"][1] == {"title_duplicate"}
    assert found["Q-lorem"][1] == {"title_repeated_words", "validate_rule"}
    assert found["Q-approved"] == (False, set(), "HUMAN_APPROVED")  # governed: never touched
    queue = {r.reference_code: r.reason for r in rows(engine, """SELECT d.reference_code, q.reason
        FROM archive_review_queue q JOIN archive_documents d ON d.id = q.document_id WHERE q.resolved_at IS NULL""")}
    assert set(queue) == {"Q-caps", "Q-nodate", "Q-future", "Q-template", "Q-dup1", "Q-dup2", "Q-lorem"}
    assert queue["Q-caps"] == "quality: title_all_caps"
    assert result["anomalies"] == 7 and result["units"] == 8

    # nothing to redo; ner stamping a document re-queues its validation (no entities is now a finding)
    status, result, _ = run_worker(database_url, engine, quality.SPEC, {})
    assert result.get("units", 0) == 0
    with engine.begin() as conn:
        conn.execute(text("""UPDATE archive_documents SET execution_log = jsonb_set(execution_log, '{ner}',
            '{"stamp": "x", "status": "DONE", "run_id": "r1"}') WHERE reference_code = 'Q-ok'"""))
    assert quality.SPEC.pending_count(engine) == 1

    # the model check: the engine of the active LLM_CHECK rule, read when the run is claimed
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, engine_name, engine_options, prompt) "
                          "VALUES ('nli', 'LLM_CHECK', 'title', 'nli-check', CAST(:eo AS jsonb), 'This is wrong.')"),
                     {"eo": json.dumps({"model": nli_model_dir, "threshold": 0.5})})
    status, result, run = run_worker(database_url, engine, quality.SPEC, {})
    assert status == "SUCCESS", run.error
    assert run.engine_name == "nli-check" and run.config["llm_check_rule"]["name"] == "nli"
    reasons = scalar(engine, "SELECT anomaly_reasons FROM archive_documents WHERE reference_code = 'Q-ok'")
    # the tiny model's entailment is 0.5 for anything: at the threshold, so flagged by the model check
    assert {r["code"] for r in reasons} == {"no_entities", "model_check"}


def test_cleaning_applies_rewrite_rules_with_one_stamp_per_rule(database_url, engine):
    insert_docs(engine, [
        {"reference_code": "C1", "title": "Letters   of  the bishop.", "scope_and_content": "Some  text"},
        {"reference_code": "C2", "title": "Clean title"},
        {"reference_code": "C3", "title": "Approved   title", "status": "HUMAN_APPROVED"},
    ])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) VALUES "
                          "('spaces', 'REWRITE', 'title', '\\s{2,}', ' '), "
                          "('dot', 'REWRITE', 'title', '\\.$', ''), "
                          "('broken', 'REWRITE', 'scope_and_content', '(unclosed', 'x'), "
                          "('off', 'REWRITE', 'title', 'Letters', 'LETTERS')"))
        conn.execute(text("UPDATE archive_cleaning_rules SET active = false WHERE name = 'off'"))
    assert cleaning.SPEC.pending_count(engine) == 2
    status, result, run = run_worker(database_url, engine, cleaning.SPEC, {})
    assert status == "SUCCESS", run.error
    assert result["rewritten"] == 1 and result["broken_rules"] == {"broken": result["broken_rules"]["broken"]}
    titles = dict(rows(engine, "SELECT reference_code, title FROM archive_documents"))
    assert titles == {"C1": "Letters of the bishop", "C2": "Clean title", "C3": "Approved   title"}
    log = scalar(engine, "SELECT execution_log -> 'cleaning' FROM archive_documents WHERE reference_code = 'C1'")
    rule_ids = dict(rows(engine, "SELECT name, id::text FROM archive_cleaning_rules"))
    assert set(log) == {rule_ids["spaces"], rule_ids["dot"], rule_ids["broken"]}
    assert log[rule_ids["spaces"]]["status"] == "DONE" and log[rule_ids["broken"]]["status"] == "ERROR"
    assert cleaning.SPEC.counts(engine) == {"pending": 0, "processed": 0, "failed": 2}

    assert cleaning.SPEC.pending_count(engine) == 0
    status, result, _ = run_worker(database_url, engine, cleaning.SPEC, {})
    assert result.get("units", 0) == 0  # a second run touches nothing
    ruleset = scalar(engine, "SELECT archive_cleaning_ruleset()")
    assert dict(rows(engine, "SELECT reference_code, cleaning_ruleset FROM archive_documents")) == {
        "C1": ruleset, "C2": ruleset, "C3": None}

    # an edited field re-queues that document only; its re-run re-stamps it and changes nothing else
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_documents SET provenance = 'Gift' WHERE reference_code = 'C2'"))
    assert cleaning.SPEC.pending_count(engine) == 1
    status, result, _ = run_worker(database_url, engine, cleaning.SPEC, {})
    assert result["units"] == 1 and result.get("rewritten", 0) == 0
    assert cleaning.SPEC.pending_count(engine) == 0

    # any change of the active rule set (here a rule activated) re-queues every governed document once
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET active = true WHERE name = 'off'"))
    assert cleaning.SPEC.pending_count(engine) == 2
    status, result, _ = run_worker(database_url, engine, cleaning.SPEC, {})
    assert result["units"] == 2
    titles = dict(rows(engine, "SELECT reference_code, title FROM archive_documents"))
    assert titles == {"C1": "LETTERS of the bishop", "C2": "Clean title", "C3": "Approved   title"}
    log = scalar(engine, "SELECT execution_log -> 'cleaning' FROM archive_documents WHERE reference_code = 'C1'")
    assert set(log) == {rule_ids["spaces"], rule_ids["dot"], rule_ids["broken"], rule_ids["off"]}
    assert cleaning.SPEC.counts(engine) == {"pending": 0, "processed": 0, "failed": 2}

    # deactivating the broken rule re-queues too; the stamps are those of the set cleaned with
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET active = false WHERE name = 'broken'"))
    assert cleaning.SPEC.pending_count(engine) == 2
    status, result, _ = run_worker(database_url, engine, cleaning.SPEC, {})
    assert result["units"] == 2 and result.get("rewritten", 0) == 0
    log = scalar(engine, "SELECT execution_log -> 'cleaning' FROM archive_documents WHERE reference_code = 'C1'")
    assert set(log) == {rule_ids["spaces"], rule_ids["dot"], rule_ids["off"]}
    assert cleaning.SPEC.counts(engine) == {"pending": 0, "processed": 2, "failed": 0}
    # HUMAN_APPROVED is never touched, whatever the rules
    assert scalar(engine, "SELECT execution_log::text || coalesce(cleaning_ruleset, '') FROM archive_documents "
                          "WHERE reference_code = 'C3'") == "{}"

    # no active rule: nothing is pending; reset-stamps re-queues everything once a rule is active again
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET active = false"))
    assert cleaning.SPEC.counts(engine) == {"pending": 0, "processed": 2, "failed": 0}
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET active = true WHERE name = 'off'"))
    assert cleaning.SPEC.pending_count(engine) == 2
    run_worker(database_url, engine, cleaning.SPEC, {})
    assert cleaning.SPEC.pending_count(engine) == 0
    assert reset_stamps(engine, "cleaning") == 2
    assert cleaning.SPEC.pending_count(engine) == 2


def test_gpu_probe_reports_the_device_and_writes_nothing(database_url, engine):
    insert_docs(engine, [{"reference_code": "G", "title": "x"}])
    before = scalar(engine, "SELECT execution_log::text FROM archive_documents")
    status, result, run = run_worker(database_url, engine, gpu_probe.SPEC, {"options": {"matmul_size": 128}})
    assert status == "SUCCESS", run.error
    assert result["torch"] and "cuda_available" in result
    devices = {d["device"]: d for d in result["devices"]}
    assert devices["cpu"]["matmul"]["ms"] > 0
    if not result["cuda_available"]:
        assert result["message"] == "no CUDA device is visible to this process"
    else:
        assert devices["cuda:0"]["total_memory_mib"] > 0
    assert gpu_probe.SPEC.pending_count(engine) is None
    assert scalar(engine, "SELECT execution_log::text FROM archive_documents") == before
