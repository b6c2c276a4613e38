"""One validation path: the API, ``scrinalia-runner run``, ``scrinalia scheduler add`` and the scheduler's
tick refuse the same bad requests (real catalogue, real PostgreSQL, the runner CLI as a real process),
and none of them writes a row. (A run that fails on its configuration once claimed, and is not retried:
tests/runner/test_configuration_failure.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import text

from scrinalia.api.app import create_app
from scrinalia.domains.archive.ledger import FinishParams
from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.scheduler.service import Scheduler
from tests.api.conftest import HASHER, add_user, api_settings, bearer

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue()

# (worker, request, the field the refusal names, a word of its message)
BAD = [
    pytest.param("nosuch", {}, "worker_name", "no worker named", id="unknown-worker"),
    pytest.param("embedding", {"options": {"x": 1}}, "options.x", "not an option", id="unknown-option"),
    pytest.param("typology", {"options": {"threshold": 2}}, "options.threshold", "<= 1.0", id="out-of-range"),
    pytest.param("typology", {"engine_name": "nope"}, "engine_name", "no engine", id="unknown-engine"),
    pytest.param("embedding", {"preset": "nope"}, "preset", "no preset", id="unknown-preset"),
    pytest.param("ner", {}, "engine_options.model", "Settings", id="missing-required-model"),
]


def _rows(engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (conn.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one(),
                conn.execute(text("SELECT count(*) FROM archive_worker_schedules")).scalar_one())


@pytest.fixture
def api(engine):
    app = create_app(engine=engine, api_settings=api_settings(), catalogue=CATALOGUE, hasher=HASHER,
                     ui_dir="/nonexistent")
    with TestClient(app) as client:
        add_user(engine, "admin@example.org", "ADMIN")
        yield client, bearer(client, "admin@example.org")


@pytest.fixture
def cli_env(database_url, monkeypatch):
    from scrinalia.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.delenv("SCRINALIA_WORKER_PLUGINS", raising=False)
    get_settings.cache_clear()
    yield {**os.environ, "PYTHONPATH": str(ROOT)}
    get_settings.cache_clear()


@pytest.mark.parametrize("worker,request_,field,words", BAD)
def test_every_entry_point_refuses_the_same_request_and_writes_nothing(api, cli_env, engine, worker, request_,
                                                                       field, words):
    client, headers = api
    # the API: enqueue (an unknown worker in the path is 404: the resource does not exist) and schedules
    r = client.post(f"/api/v1/system/workers/{worker}/runs", headers=headers, json=request_)
    if field == "worker_name":
        assert r.status_code == 404, r.text
    else:
        assert r.status_code == 422, r.text
        assert words in r.json()["fields"][field]
    r = client.post("/api/v1/system/schedules", headers=headers,
                    json={"worker_name": worker, "interval_seconds": 3600, "request": request_})
    assert r.status_code == 422, r.text
    expected_field = field if field == "worker_name" else f"request.{field}"
    assert words in r.json()["fields"][expected_field]

    # scrinalia scheduler add
    from scrinalia.cli.main import cli

    added = CliRunner().invoke(cli, ["scheduler", "add", worker, "--every", "3600", "--request", json.dumps(request_)])
    assert added.exit_code == 2 and field in added.output and words in added.output, added.output

    # scrinalia-runner run (a real process)
    argv = [sys.executable, "-m", "runner.cli", "run", worker, "--heartbeat", "0.3", "--lease", "5"]
    for key, value in (request_.get("options") or {}).items():
        argv += ["--option", f"{key}={json.dumps(value)}"]
    for flag, key in (("--engine", "engine_name"), ("--preset", "preset")):
        if key in request_:
            argv += [flag, request_[key]]
    done = subprocess.run(argv, cwd=ROOT, env=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and words in done.stderr

    assert _rows(engine) == (0, 0)

    # the scheduler's tick: a schedule whose request no longer validates (written around the validation,
    # as if the catalogue or the settings had changed since) enqueues nothing and says why
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at) "
                          "VALUES (:w, 3600, CAST(:r AS jsonb), now())"), {"w": worker, "r": json.dumps(request_)})
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        (fired,) = scheduler.tick().fired
    finally:
        scheduler.release()
    assert fired.run_id is None and fired.outcome.startswith("refused: ") and field in fired.outcome
    assert _rows(engine) == (0, 1)
    listed = client.get("/api/v1/system/schedules", headers=headers).json()["schedules"]
    assert listed[0]["last_outcome"] == fired.outcome


def test_the_documented_typology_threshold_example_exits_2(cli_env, engine):
    done = subprocess.run([sys.executable, "-m", "runner.cli", "run", "typology", "--option", "threshold=2"],
                          cwd=ROOT, env=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "options.threshold" in done.stderr
    assert _rows(engine) == (0, 0)


def test_ner_is_refused_at_enqueue_with_what_to_set_and_where(api, engine):
    client, headers = api
    r = client.post("/api/v1/system/workers/ner/runs", headers=headers, json={})
    assert r.status_code == 422
    message = r.json()["fields"]["engine_options.model"]
    assert "Workers > ner > Settings" in message and "/api/v1/system/workers/ner/settings" in message
    # the worker's card says it too, before anyone presses Run
    effective = client.get("/api/v1/system/workers/ner", headers=headers).json()["settings"]["effective"]
    assert effective["error"]["field"] == "engine_options.model"
    # with a model in its settings, it is accepted
    r = client.put("/api/v1/system/workers/ner/settings", headers=headers,
                   json={"engine_options": {"model": "/srv/models/ner"}})
    assert r.status_code == 200, r.text
    assert client.post("/api/v1/system/workers/ner/runs", headers=headers, json={}).status_code == 201


@pytest.fixture
def validations(monkeypatch):
    """Every shape check (``ledger.check_request_shape``) and every resolution (``WorkerSpec.resolve``) of
    this process, each with the request it judged: the real functions, only counted."""
    from scrinalia.domains.archive import ledger
    from scrinalia.domains.archive.workers.sdk import WorkerSpec

    seen: dict[str, list[dict]] = {"checked": [], "resolved": []}
    check, resolve = ledger.check_request_shape, WorkerSpec.resolve

    def counted_check(request):
        seen["checked"].append(dict(request))
        return check(request)

    def counted_resolve(spec, engine, request, layer=None):
        seen["resolved"].append(dict(request))
        return resolve(spec, engine, request, layer=layer)

    monkeypatch.setattr(ledger, "check_request_shape", counted_check)
    monkeypatch.setattr(WorkerSpec, "resolve", counted_resolve)
    return seen


def _once(seen: dict[str, list[dict]], request: dict) -> None:
    """The entry point checked ``request`` once and resolved it once (decision 0135)."""
    assert seen["checked"].count(request) == 1, seen
    assert seen["resolved"].count(request) == 1, seen
    seen["checked"].clear()
    seen["resolved"].clear()


def test_each_entry_point_checks_and_resolves_its_request_once(api, engine, validations):
    from scrinalia.domains.archive import ledger
    from tests.ledger.helpers import register_runner

    client, headers = api
    request_ = {"options": {"threshold": 0.7}, "db_batch_size": 8}
    # the API's enqueue: validated, then written by ledger.enqueue without a second check
    r = client.post("/api/v1/system/workers/typology/runs", headers=headers, json=request_)
    assert r.status_code == 201, r.text
    _once(validations, request_)
    # the API's retry of that run, once it failed
    run_id = uuid.UUID(r.json()["run_id"])
    runner_id = register_runner(engine, ["typology"])
    assert ledger.claim_next(engine, runner_id, ["typology"], 60).run_id == run_id
    ledger.finish(engine, run_id, runner_id, FinishParams("FAILED", error="boom", exit_reason="exception"))
    r = client.post(f"/api/v1/system/runs/{run_id}/retry", headers=headers)
    assert r.status_code == 201, r.text
    _once(validations, request_)
    ledger.request_cancel(engine, uuid.UUID(r.json()["run_id"]))  # the worker's slot, free for the schedule
    # a schedule's creation, then the scheduler's tick that fires it
    r = client.post("/api/v1/system/schedules", headers=headers,
                    json={"worker_name": "typology", "interval_seconds": 3600, "request": request_,
                          "first_delay_seconds": 0})
    assert r.status_code == 201, r.text
    _once(validations, request_)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        (fired,) = scheduler.tick().fired
    finally:
        scheduler.release()
    assert fired.outcome == "enqueued", fired
    _once(validations, request_)
    # the settings PUT: its values are checked and resolved once; then its answer's effective settings
    # and their warnings, one resolution of an empty request over what was stored
    settings = {"options": {"threshold": 0.3}, "db_batch_size": 16}
    r = client.put("/api/v1/system/workers/typology/settings", headers=headers, json=settings)
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["db_batch_size"] == 16
    assert validations["checked"] == validations["resolved"] == [settings, {}], validations


def test_the_one_shot_run_checks_and_resolves_its_request_once(database_url, engine, validations, monkeypatch):
    """``run_once`` starts its run at once: the resolution of its validation is the run's, the supervisor
    does not resolve it again (the claim of a daemon, which comes later, does: decision 0090)."""
    from runner.oneshot import run_once
    from tests.runner.conftest import PLUGINS

    monkeypatch.setenv("SCRINALIA_WORKER_PLUGINS", PLUGINS)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    request_ = {"options": {"units": 2}}
    row = run_once(database_url, "ok", request_, lease_seconds=5, heartbeat_seconds=1)
    assert row.status == "SUCCESS", row.error
    assert row.options == {"units": 2} and row.config["db_batch_size"] == 1  # record_start wrote that resolution
    _once(validations, request_)
