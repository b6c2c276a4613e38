"""``runner.oneshot.run_once``: the programmatic one-shot runner (same child entry point as the daemon)."""
from __future__ import annotations

import os

import pytest

from runner.oneshot import parse_option, run_once
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.errors import WorkerRunAlreadyActive
from scrinalia.domains.archive.workers.sdk import UnknownWorker
from tests.runner.conftest import PLUGINS, ROOT


@pytest.fixture(autouse=True)
def _plugins(monkeypatch):
    monkeypatch.setenv("SCRINALIA_WORKER_PLUGINS", PLUGINS)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_run_once_success_writes_a_cli_row_and_a_stopped_cli_runner(database_url, engine):
    seen: list[dict] = []
    row = run_once(database_url, "ok", {"options": {"units": 5}}, requested_by="alice",
                   lease_seconds=5, heartbeat_seconds=1, on_progress=seen.append)
    assert row.status == "SUCCESS", row
    assert row.trigger == "CLI" and row.requested_by == "alice"
    assert row.result == {"processed": 5}
    assert row.progress["done"] == 5 and row.progress["total"] == 5
    assert row.options == {"units": 5}
    assert row.config["db_batch_size"] == 1
    assert row.metrics["peak_rss_bytes"] > 0 and row.metrics["cpu_seconds"] >= 0
    assert row.metrics["start_method"] == "spawn"
    assert seen and seen[-1]["done"] == 5
    assert row.runner_id is not None
    runner = registry.get_runner(engine, row.runner_id)
    assert runner.kind == "cli" and runner.state == "stopped" and runner.capabilities == ["ok"]


def test_run_once_failure_is_a_failed_row_with_a_fingerprint(database_url, engine):
    row = run_once(database_url, "raises", {}, lease_seconds=5, heartbeat_seconds=1)
    assert row.status == "FAILED"
    assert row.exit_reason == "exception" and row.exit_code == 1 and row.exit_signal is None
    assert row.error.startswith("ValueError: boom in run ")
    assert row.error_fingerprint == "valueerror: boom in run <uuid>"


def test_run_once_refuses_a_busy_slot_and_an_unknown_worker(database_url, engine):
    ledger.enqueue(engine, "ok", {})
    with pytest.raises(WorkerRunAlreadyActive):
        run_once(database_url, "ok", {}, lease_seconds=5, heartbeat_seconds=1)
    with pytest.raises(UnknownWorker):
        run_once(database_url, "no-such-worker", {}, lease_seconds=5, heartbeat_seconds=1)


def test_option_values_are_read_by_their_declared_type_else_as_json_scalars():
    from scrinalia.domains.archive.workers.gpu_probe import SPEC as probe
    from scrinalia.domains.archive.workers.sdk import InvalidOption
    from scrinalia.domains.archive.workers.validation import option_from_text

    assert parse_option("a=x=y") == ("a", "x=y")
    # Undeclared: a JSON scalar, else the text (the validation then names the unknown option).
    assert option_from_text(None, "options", "a", "1") == 1
    assert option_from_text(None, "options", "a", "true") is True
    assert option_from_text(None, "options", "a", "null") is None
    assert option_from_text(None, "options", "a", "hello") == "hello"
    assert option_from_text(None, "options", "a", '"quoted"') == "quoted"
    assert option_from_text(None, "options", "a", "[1,2]") == "[1,2]"
    # Declared: by its type, so "64" is the integer 64 and a string option keeps "64".
    assert option_from_text(probe, "options", "matmul_size", "64") == 64
    with pytest.raises(InvalidOption, match="options.matmul_size"):
        option_from_text(probe, "options", "matmul_size", "big")
    with pytest.raises(ValueError):
        parse_option("novalue")
