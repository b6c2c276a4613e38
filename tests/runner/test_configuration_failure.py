"""A scheduled run that fails on its configuration once claimed (accepted at enqueue, but no model where
its options point on the runner's host) ends FAILED ``configuration`` in a real daemon's child, and the
scheduler does not retry it: a retry would fail the same way, holding the slot through its backoff."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.scheduler.retry import retry_failed_scheduled_runs
from scrinalia.scheduler.schedules import create_schedule
from scrinalia.scheduler.service import Scheduler
from tests.runner.conftest import wait_status

pytestmark = pytest.mark.slow


def test_a_configuration_failure_is_recorded_as_such_and_not_retried(engine, start_runner):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_documents (reference_code, title) VALUES ('R1', 'Carta de Lisboa')"))
    catalogue = load_catalogue()
    create_schedule(engine, "ner", 3600, {"engine_options": {"model": "/nonexistent/ner-model"}},
                    catalogue=catalogue)
    scheduler = Scheduler(engine, catalogue)
    try:
        (fired,) = scheduler.tick().fired
        assert fired.outcome == "enqueued" and fired.run_id is not None
        start_runner("--capabilities", "ner", "--poll", "0.2", "--heartbeat", "0.5", "--lease", "5",
                     "--start-method", "spawn")
        run = wait_status(engine, fired.run_id, "FAILED", timeout=90)
        assert run.trigger == "SCHEDULE" and run.exit_reason == "configuration", run
        assert "EngineUnavailable" in run.error and "no config.json" in run.error
        assert retry_failed_scheduled_runs(engine) == []
        assert scheduler.tick().retries == []
    finally:
        scheduler.release()


def test_a_string_for_an_integer_is_refused_at_claim_with_the_apis_message(engine, start_runner):
    """Strict types at claim too (decision 0140): a request stored before the API refused it (written
    here without the shared validation) fails ``configuration`` with the message the API gives."""
    from scrinalia.domains.archive import ledger

    run = ledger.enqueue(engine, "ner", {"engine_options": {"model": "/srv/models/ner", "batch_size": "8"}})
    start_runner("--capabilities", "ner", "--poll", "0.2", "--heartbeat", "0.5", "--lease", "5",
                 "--start-method", "spawn")
    failed = wait_status(engine, run.run_id, "FAILED", timeout=90)
    assert failed.exit_reason == "configuration", failed
    assert "engine_options.batch_size: must be an integer, not a string ('8')" in failed.error, failed.error
