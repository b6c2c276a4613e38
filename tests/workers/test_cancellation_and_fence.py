"""Cancellation at batch boundaries across the whole catalogue, and the fence on archive writes."""
from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from sqlalchemy import text

from runner.oneshot import run_once
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.workers import ner
from scrinalia.domains.archive.workers.plugins import load_catalogue
from tests.workers.helpers import HookChannel, insert_docs, register_runner, run_in_process, scalar
from tests.workers.tiny_models import NLI_KEYWORDS

pytestmark = pytest.mark.slow

BATCH = 2
DOCS = 7  # four batches of at most two


def _archive(engine):
    insert_docs(engine, [
        {"reference_code": f"D{i}", "title": f"Letters of  Maria Joaquina to Lisboa, number {i}",
         "scope_and_content": "Minutes of the council.", "date_text": "1800"}
        for i in range(DOCS)
    ])
    with engine.begin() as conn:
        for name in list(NLI_KEYWORDS)[:2]:
            conn.execute(text("INSERT INTO archive_typologies (name) VALUES (:n)"), {"n": name})
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))


def _request(name, ner_model_dir, nli_model_dir):
    request: dict[str, Any] = {"db_batch_size": BATCH}
    if name == "embedding":
        request["preset"] = "cpu"
    if name == "ner":
        request["engine_options"] = {"model": ner_model_dir}
    if name == "typology":
        request["engine_options"] = {"model": nli_model_dir}
    return request


def _stamped(engine, spec) -> int:
    if spec.stamp_key is None:
        return 0
    return scalar(engine, "SELECT count(*) FROM archive_documents WHERE execution_log ? :k", k=spec.stamp_key)


def test_every_worker_stops_at_the_next_batch_boundary(engine, ner_model_dir, nli_model_dir):
    """Walks the whole catalogue: cancellation asked during the first batch ends the run CANCELLED after
    that batch, with the batch committed and the summary saying so."""
    _archive(engine)
    catalogue = load_catalogue()
    assert {"embedding", "ner", "typology", "quality-validator", "cleaning", "gpu-probe"} <= set(catalogue)
    for name, spec in catalogue.items():
        def cancel_once_work_was_done(progress, channel):
            if progress["done"] > 0:
                channel.cancel = True

        channel = HookChannel(cancel_once_work_was_done)
        status, result, run = run_in_process(engine, spec, _request(name, ner_model_dir, nli_model_dir), channel)
        assert status == "CANCELLED", (name, result)
        assert run.status == "CANCELLED" and run.exit_reason == "cancelled"
        first_batch = BATCH if spec.unit == "document" else 1
        assert result["units"] == first_batch, (name, result)
        assert run.result["units"] == first_batch
        if spec.stamp_key is not None:
            # exactly one batch was committed: the partial result is in the archive, nothing more
            assert _stamped(engine, spec) == BATCH, name
            assert spec.pending_count(engine) == DOCS - BATCH, name


def test_a_cancelled_run_through_the_runner_ends_cancelled_with_its_batches_committed(database_url, engine):
    insert_docs(engine, [{"reference_code": f"E{i}", "title": f"Letters of the bishop, number {i}"}
                         for i in range(400)])
    asked = threading.Event()
    started: dict[str, Any] = {}

    def on_progress(progress):
        if progress.get("done", 0) > 0 and not asked.is_set():
            asked.set()
            ledger.request_cancel(engine, started["run"].run_id, requested_by="test")

    run = run_once(database_url, "embedding", {"db_batch_size": 4, "preset": "cpu",
                                               "engine_options": {"batch_size": 4}},
                   lease_seconds=10, heartbeat_seconds=0.5, on_progress=on_progress,
                   on_start=lambda r: started.setdefault("run", r))
    assert run.status == "CANCELLED", run.error
    stamped = scalar(engine, "SELECT count(*) FROM archive_documents WHERE execution_log ? 'embedding'")
    assert 0 < stamped < 400 and stamped % 4 == 0  # whole batches only
    assert run.result["units"] == stamped
    assert scalar(engine, "SELECT count(*) FROM archive_document_embeddings") == stamped


def test_a_run_whose_lease_was_taken_commits_no_further_batch(engine, ner_model_dir):
    insert_docs(engine, [{"reference_code": f"F{i}", "title": f"Carta de Maria {i}"} for i in range(6)])
    seen = {}

    def take_the_lease_after_the_first_batch(progress, channel):
        if progress["done"] > 0 and "count" not in seen:
            with engine.begin() as conn:  # what expire_leases does to a runner that stopped renewing
                conn.execute(text("UPDATE archive_worker_runs SET status = 'INTERRUPTED', finished_at = now(), "
                                  "exit_reason = 'lease-lost' WHERE worker_name = 'ner' AND status = 'RUNNING'"))
                seen["count"] = conn.execute(text(
                    "SELECT count(*) FROM archive_documents WHERE execution_log ? 'ner'")).scalar()

    status, result, run = run_in_process(
        engine, ner.SPEC, {"db_batch_size": 2, "engine_options": {"model": ner_model_dir}},
        HookChannel(take_the_lease_after_the_first_batch))
    assert status == "LEASE_LOST"
    assert seen["count"] == 2 and result["units"] == 2
    assert scalar(engine, "SELECT count(*) FROM archive_documents WHERE execution_log ? 'ner'") == 2
    assert scalar(engine, "SELECT count(*) FROM archive_document_entities") == 2  # only the first batch's
    assert run.status == "INTERRUPTED"


def test_a_child_whose_lease_was_taken_commits_no_further_batch(database_url, engine):
    """The same through a real child: the lease is taken while it runs; after that, no batch lands."""
    insert_docs(engine, [{"reference_code": f"H{i}", "title": f"Letters of the bishop, number {i}"}
                         for i in range(300)])
    seen = {}
    thief = register_runner(engine, ["embedding"])

    def on_progress(progress):
        if progress.get("done", 0) > 0 and "count" not in seen:
            with engine.begin() as conn:
                # another runner takes the run (its row is locked first, as a batch commit locks it: the
                # two serialise); the child's runner no longer renews it and its next commit is fenced out
                conn.execute(text("UPDATE archive_worker_runs SET runner_id = :thief "
                                  "WHERE worker_name = 'embedding' AND status = 'RUNNING'"), {"thief": thief})
                seen["count"] = conn.execute(text(
                    "SELECT count(*) FROM archive_documents WHERE execution_log ? 'embedding'")).scalar()

    run = run_once(database_url, "embedding", {"db_batch_size": 4, "preset": "cpu"},
                   lease_seconds=30, heartbeat_seconds=10, on_progress=on_progress)
    assert "count" in seen
    final = scalar(engine, "SELECT count(*) FROM archive_documents WHERE execution_log ? 'embedding'")
    assert final == seen["count"] and final < 300
    # the row is the thief's now: this child's runner wrote nothing more to it
    assert run.runner_id == thief and run.status == "RUNNING"
    assert json.dumps(run.to_json())


@pytest.mark.parametrize("name", ["embedding", "ner", "typology", "quality-validator", "cleaning"])
def test_every_document_worker_cancelled_through_a_real_child(database_url, engine, ner_model_dir, nli_model_dir,
                                                               name):
    """The same walk through the runner: the cancel request travels ledger -> heartbeat -> child, and
    the worker stops at the next batch boundary with whole batches committed and counted."""
    n = 200 if name == "embedding" else 1500
    insert_docs(engine, [{"reference_code": f"W{i}", "title": f"Letters of  Maria Joaquina, number {i}",
                          "date_text": "1800"} for i in range(n)])
    with engine.begin() as conn:
        for typ in list(NLI_KEYWORDS)[:2]:
            conn.execute(text("INSERT INTO archive_typologies (name) VALUES (:n)"), {"n": typ})
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))
    spec = load_catalogue()[name]
    started: dict[str, Any] = {}
    asked = threading.Event()

    def on_progress(progress):
        if progress.get("done", 0) > 0 and not asked.is_set():
            asked.set()
            ledger.request_cancel(engine, started["run"].run_id, requested_by="test")

    run = run_once(database_url, name, _request(name, ner_model_dir, nli_model_dir),
                   lease_seconds=5, heartbeat_seconds=0.3, on_progress=on_progress,
                   on_start=lambda r: started.setdefault("run", r))
    assert run.status == "CANCELLED", (run.status, run.error)
    assert run.exit_reason == "cancelled"
    stamped = _stamped(engine, spec)
    assert 0 < stamped < n and stamped % BATCH == 0  # whole batches only, and not all of them
    assert run.result["units"] == stamped  # the summary is what was committed
    assert spec.pending_count(engine) == n - stamped
