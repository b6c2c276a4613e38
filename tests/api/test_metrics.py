"""/metrics by prometheus_client (decisions 0166, 0167): parsed with prometheus_client's own parser from a
real API process (two uvicorn workers), its figures checked against the database, every metric that the
Grafana dashboard and the alert rules name present in it, and the rules checked by promtool."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from scrinalia.scheduler.schedules import create_schedule
from tests.api.live import live_api
from tests.api.workers_fixture import WORKERS
from tests.ledger.helpers import register_runner

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "ops" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "ops" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "ops" / "grafana" / "scrinalia.json"
TOKEN = "metrics-token-for-the-test-0123456789"
_NAME = re.compile(r"\bscrinalia_[a-z0-9_]+\b")


def _ledger_with_history(engine) -> dict[str, object]:
    """A runner holding a RUNNING run, a QUEUED run, finished runs of each outcome, a quarantined schedule."""
    runner = register_runner(engine, ["alpha", "beta", "gamma"], lease=60, name="gpu-host")
    for status, error in (("SUCCESS", None), ("SUCCESS", None), ("FAILED", "RuntimeError: boom"),
                          ("CANCELLED", None)):
        ledger.enqueue(engine, "alpha", {})
        run = ledger.claim_next(engine, runner, ["alpha"], 60)
        assert run is not None
        ledger.finish(engine, run.run_id, runner, FinishParams(status, error=error,
                      exit_reason="exception" if error else None))
    ledger.enqueue(engine, "gamma", {})
    ledger.request_cancel(engine, ledger.active_run(engine, "gamma").run_id)  # QUEUED -> CANCELLED, never started
    ledger.enqueue(engine, "alpha", {})
    running = ledger.claim_next(engine, runner, ["alpha"], 60)
    ledger.enqueue(engine, "beta", {})  # waits: claimable, not claimed
    schedule = create_schedule(engine, "gamma", 3600, {}, catalogue={w.name: w for w in WORKERS},
                               first_delay_s=3600)
    with engine.begin() as conn:  # as the scheduler quarantines (tests/scheduler/test_quarantine.py)
        conn.execute(text("UPDATE archive_worker_schedules SET enabled = false, quarantined_at = now(), "
                          "quarantine_fingerprint = 'runtimeerror: boom' WHERE id = :i"), {"i": schedule.id})
    return {"runner": runner, "running": running, "schedule": schedule}


def _scrape(base: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{base}/metrics", headers=headers, timeout=20)


def _families(body: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(body)}


def _samples(families) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}


def _referenced() -> set[str]:
    """Every scrinalia_* metric the dashboard's queries and the alert rules' expressions name."""
    names: set[str] = set()
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            names |= set(_NAME.findall(target["expr"]))
    for variable in dashboard["templating"]["list"]:
        names |= set(_NAME.findall(json.dumps(variable.get("query", ""))))
    # The rules file whole (expressions, annotations, comments): whatever it names must exist.
    return names | set(_NAME.findall(RULES.read_text()))


def test_metrics_parse_and_hold_every_metric_the_dashboard_and_rules_use(engine, database_url):
    _ledger_with_history(engine)
    with live_api(database_url, workers=2, API_METRICS_TOKEN=TOKEN) as api:
        assert _scrape(api.base).status_code == 401
        assert _scrape(api.base, Authorization="Bearer wrong-token-wrong-token").status_code == 401
        answers = [_scrape(api.base, Authorization=f"Bearer {TOKEN}") for _ in range(4)]
    for r in answers:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = _families(answers[0].text)
    samples = _samples(families)

    # Every metric the dashboard and the rules name exists, with samples (the relay's counter, which
    # is process-local and counts only what was dropped, exists as a family).
    sample_names = {name for name, _ in samples}
    referenced = _referenced()
    assert len(referenced) >= 20, referenced
    missing = {n for n in referenced if n not in sample_names and n != "scrinalia_events_dropped_total"}
    assert not missing, f"named by ops/ but not exported: {sorted(missing)}"
    assert families["scrinalia_events_dropped"].type == "counter"

    def value(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    # The figures are the database's.
    assert value("scrinalia_runs_finished_total", worker="alpha", status="SUCCESS") == 2
    assert value("scrinalia_runs_finished_total", worker="alpha", status="FAILED") == 1
    assert value("scrinalia_runs_finished_total", worker="alpha", status="CANCELLED") == 1
    assert value("scrinalia_runs_finished_total", worker="gamma", status="CANCELLED") == 1
    assert families["scrinalia_runs_finished"].type == "counter"
    assert families["scrinalia_run_duration_seconds"].type == "histogram"
    # alpha's four runs started and ended (timed); gamma's cancel never started: counted, not timed.
    assert value("scrinalia_run_duration_seconds_count", worker="alpha") == 4
    assert value("scrinalia_run_duration_seconds_bucket", worker="alpha", le="+Inf") == 4
    assert value("scrinalia_run_duration_seconds_bucket", worker="alpha", le="1.0") == 4  # milliseconds each
    assert value("scrinalia_run_duration_seconds_count", worker="gamma") == 0
    assert value("scrinalia_worker_runs_active", worker="alpha", status="RUNNING") == 1
    assert value("scrinalia_worker_runs_active", worker="beta", status="QUEUED") == 1
    assert value("scrinalia_worker_queued_wait_seconds", worker="beta") >= 0
    assert value("scrinalia_worker_failures_24h", worker="alpha") == 1
    assert value("scrinalia_runners", state="online") == 1
    (runner_labels,) = [dict(labels) for name, labels in samples if name == "scrinalia_runner_up"]
    assert runner_labels["runner"] == "gpu-host" and value("scrinalia_runner_up", **runner_labels) == 1
    assert 0 <= value("scrinalia_runner_heartbeat_age_seconds", **runner_labels) < 60
    assert value("scrinalia_runner_lease_seconds", **runner_labels) == 60
    assert value("scrinalia_runner_running_runs", **runner_labels) == 1
    margin = value("scrinalia_run_lease_margin_seconds", worker="alpha", runner_id=runner_labels["runner_id"])
    assert 0 < margin <= 60
    (schedule_labels,) = [dict(labels) for name, labels in samples if name == "scrinalia_schedule_quarantined"]
    assert schedule_labels["worker"] == "gamma" and value("scrinalia_schedule_quarantined", **schedule_labels) == 1
    assert value("scrinalia_notification_probe_ok") == 1
    assert 0 <= value("scrinalia_notification_lag_seconds") < 1
    assert 0 <= value("scrinalia_notification_queue_usage_ratio") < 1
    assert value("scrinalia_worker_units", worker="alpha", kind="pending") >= 0
    (build,) = [dict(labels) for name, labels in samples if name == "scrinalia_build_info"]
    assert build["schema_head"] and build["version"]

    # Both processes answer the same (all but the probe's own timing and the ages, which move).
    moving = {"scrinalia_notification_lag_seconds", "scrinalia_runner_heartbeat_age_seconds",
              "scrinalia_run_lease_margin_seconds", "scrinalia_worker_queued_wait_seconds",
              "scrinalia_worker_queued_age_seconds",
              "scrinalia_events_dropped_created"}  # per process: when each process's counter was made
    steady = [{k: v for k, v in _samples(_families(r.text)).items() if k[0] not in moving} for r in answers]
    assert all(s == steady[0] for s in steady[1:])


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: `make system-deps` installs Debian's prometheus package")
        pytest.skip("promtool is not installed (make system-deps installs Debian's prometheus package)")
    return found


def test_promtool_checks_and_tests_the_alert_rules():
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            timeout=60, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_totals_start_from_the_history_and_follow_every_end(empty_database_url):
    """Migration 0016 counts the runs that ended before it; its trigger counts every end after it, by
    whichever statement ends the run (finish, a QUEUED cancel, a lease expiry)."""
    from scrinalia.db import migrate
    from scrinalia.db.engine import create_engine_from_url

    migrate.upgrade(empty_database_url, "0011")
    engine = create_engine_from_url(empty_database_url)
    try:
        with engine.begin() as conn:  # history written by the previous release
            conn.execute(text(
                "INSERT INTO archive_worker_runs (worker_name, status, trigger, request, queued_at, started_at, "
                "finished_at, duration_ms) SELECT 'old', s::worker_run_status, 'API', '{}', now(), "
                "CASE WHEN d IS NULL THEN NULL ELSE now() END, now(), d "
                "FROM (VALUES ('SUCCESS', 500), ('SUCCESS', 20000), ('FAILED', 4000000), ('CANCELLED', NULL)) "
                "AS v(s, d)"))
        migrate.upgrade(empty_database_url)
        runner = register_runner(engine, ["old"], lease=60)
        ledger.enqueue(engine, "old", {})
        run = ledger.claim_next(engine, runner, ["old"], 60)
        ledger.finish(engine, run.run_id, runner, FinishParams("FAILED", error="RuntimeError: x",
                                                                       exit_reason="exception"))
        ledger.enqueue(engine, "old", {})
        ledger.request_cancel(engine, ledger.active_run(engine, "old").run_id)
        ledger.enqueue(engine, "old", {})
        expiring = ledger.claim_next(engine, runner, ["old"], 60)
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 second' "
                              "WHERE run_id = :r"), {"r": expiring.run_id})
        assert len(ledger.expire_leases(engine)) == 1
        with engine.connect() as conn:
            totals = {r.status: (r.runs, r.timed, list(r.duration_buckets)) for r in conn.execute(text(
                "SELECT status::text AS status, runs, timed, duration_buckets FROM archive_run_totals_now() "
                "WHERE worker_name = 'old'"))}
            bounds = conn.execute(text("SELECT archive_run_duration_bounds()")).scalar_one()
    finally:
        engine.dispose()
    assert bounds[:3] == [1, 5, 15] and len(bounds) == len(totals["SUCCESS"][2])
    # 0.5 s and 20 s: cumulative buckets (<=1: 1, <=30: 2); 4000 s: past 3600, within 7200
    assert totals["SUCCESS"][:2] == (2, 2) and totals["SUCCESS"][2][0] == 1 and totals["SUCCESS"][2][3] == 2
    assert totals["FAILED"][:2] == (2, 2)
    assert totals["FAILED"][2][bounds.index(3600)] == 1 and totals["FAILED"][2][bounds.index(7200)] == 2
    assert totals["CANCELLED"][:2] == (2, 0) and set(totals["CANCELLED"][2]) == {0}  # never started: not timed
    assert totals["INTERRUPTED"][:2] == (1, 1)


def test_every_counted_series_exists_from_the_first_scrape_of_a_fresh_install(engine):
    """Issue 28: on a fresh database, before any run has ended, each catalogue worker has its finished-run
    counter at 0 for each outcome, an empty duration histogram and a failure count of 0, and each reason
    of the relay's drops is at 0: the dashboard and the alert rules see 0, not "No data" (Prometheus'
    guidance: a labelled series that can appear is exported from the start)."""
    from fastapi.testclient import TestClient

    from scrinalia.domains.archive.ledger_events import DROP_REASONS
    from tests.api.conftest import make_app

    with TestClient(make_app(engine, metrics_token=TOKEN)) as client:
        r = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    samples = _samples(_families(r.text))
    for worker in (w.name for w in WORKERS):
        for status in ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"):
            key = ("scrinalia_runs_finished_total", (("status", status), ("worker", worker)))
            assert samples.get(key) == 0, key
        assert samples.get(("scrinalia_run_duration_seconds_count", (("worker", worker),))) == 0
        assert samples.get(("scrinalia_run_duration_seconds_sum", (("worker", worker),))) == 0
        assert samples.get(("scrinalia_run_duration_seconds_bucket", (("le", "+Inf"), ("worker", worker)))) == 0
        assert samples.get(("scrinalia_worker_failures_24h", (("worker", worker),))) == 0
    for reason in DROP_REASONS:
        assert samples.get(("scrinalia_events_dropped_total", (("reason", reason),))) is not None, reason


def test_each_live_runner_s_warm_models_are_in_the_metrics_from_the_first_scrape(engine):
    """Decision 0381: the fork server's memory per warm model, as the runner's heartbeat wrote it into its
    registry row; a live runner that reported none (yet) is at 0 from the first scrape, a stopped one
    has no series."""
    from fastapi.testclient import TestClient

    from scrinalia.domains.archive import registry
    from tests.api.conftest import make_app

    fresh = register_runner(engine, ["alpha"], lease=60, name="fresh")
    warm = register_runner(engine, ["alpha"], lease=60, name="warm-host")
    gone = register_runner(engine, ["alpha"], lease=60, name="gone")
    registry.stop(engine, gone)
    model = {"model_class": "AutoModel", "model_dir": "/srv/models/minilm", "dtype": "float32",
             "bytes": 90_866_688, "workers": ["alpha"]}
    ledger.heartbeat(engine, warm, 60, warm={"models": [model], "bytes": 90_866_688, "limit_bytes": 4096 << 20})
    with TestClient(make_app(engine, metrics_token=TOKEN)) as client:
        r = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    families = _families(r.text)
    samples = _samples(families)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    fresh_labels = {"runner": "fresh", "runner_id": str(fresh)}
    warm_labels = {"runner": "warm-host", "runner_id": str(warm)}
    assert value("scrinalia_runner_warm_models_bytes", **fresh_labels) == 0
    assert value("scrinalia_runner_warm_models_limit_bytes", **fresh_labels) == 0
    assert value("scrinalia_runner_warm_models_bytes", **warm_labels) == 90_866_688
    assert value("scrinalia_runner_warm_models_limit_bytes", **warm_labels) == 4096 << 20
    assert value("scrinalia_runner_warm_model_bytes", **warm_labels, model_class="AutoModel",
                 model_dir="/srv/models/minilm", dtype="float32") == 90_866_688
    per_model = [dict(labels) for name, labels in samples if name == "scrinalia_runner_warm_model_bytes"]
    assert [labels["runner"] for labels in per_model] == ["warm-host"]
    assert not any(dict(labels).get("runner") == "gone" for _, labels in samples)
    assert families["scrinalia_runner_warm_models_bytes"].type == "gauge"
    # A heartbeat that says nothing of the warm models (None: unchanged) keeps what the row has.
    ledger.heartbeat(engine, warm, 60)
    row = registry.get_runner(engine, warm)
    assert row is not None and row.warm["bytes"] == 90_866_688
