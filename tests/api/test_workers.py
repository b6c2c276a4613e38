"""GET /system/workers (settings, engines, counts, active/last run, runners, queued reason), runners and
drain, settings with revisions, metrics."""
from __future__ import annotations

import uuid

from sqlalchemy import text

from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import FinishParams
from tests.ledger.helpers import register_runner

W = "/api/v1/system/workers"


def _worker(client, headers, name):
    body = client.get(W, headers=headers).json()
    return next(w for w in body["workers"] if w["name"] == name)


def test_the_catalogue_with_engines_presets_options_and_effective_settings(client, viewer_headers):
    body = client.get(W, headers=viewer_headers).json()
    assert [w["name"] for w in body["workers"]] == ["alpha", "beta", "gamma"]
    alpha = body["workers"][0]
    assert {e["name"] for e in alpha["engines"]} == {"small", "large"}
    assert {(p["engine"], p["name"]) for p in alpha["presets"]} >= {("small", "fast"), ("large", "gpu")}
    assert alpha["options"][0]["name"] == "threshold"
    eff = alpha["settings"]["effective"]
    assert eff["engine_name"] == "small" and eff["options"] == {"threshold": 0.5}
    assert eff["sources"]["engine_name"] == "default"
    assert alpha["settings"]["persisted"] is None
    assert alpha["active_run"] is None and alpha["last_run"] is None and alpha["queued_reason"] is None


def test_counts_follow_the_catalogue_stamps(client, viewer_headers, engine):
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO archive_documents (reference_code, title, status) "
            "SELECT 'R' || g, 'T' || g, CASE WHEN g <= 2 THEN 'HUMAN_APPROVED'::document_status ELSE 'DRAFT' END "
            "FROM generate_series(1, 10) g"))
        # alpha: 6 done (stamp = md5(title)), 1 error, 3 pending
        conn.execute(text("UPDATE archive_documents SET execution_log = jsonb_build_object('alpha', "
                          "jsonb_build_object('stamp', md5(title), 'status', 'DONE')) WHERE id <= 6"))
        conn.execute(text("UPDATE archive_documents SET execution_log = jsonb_build_object('alpha', "
                          "jsonb_build_object('stamp', md5(title), 'status', 'ERROR')) WHERE id = 7"))
    body = client.get(W, headers=viewer_headers).json()
    counts = {w["name"]: w["counts"] for w in body["workers"]}
    assert counts["alpha"] == {"pending": 3, "processed": 6, "failed": 1}
    assert counts["beta"] == {"pending": 8, "processed": 0, "failed": 0}  # governed: 2 approved excluded
    assert counts["gamma"] == {"pending": None, "processed": None, "failed": None}


def test_active_run_with_progress_last_run_and_capable_runners(client, admin_headers, engine):
    done = ledger.enqueue(engine, "alpha", {})
    rid = register_runner(engine, ["alpha", "beta"], name="gpu-1")
    ledger.claim_next(engine, rid, ["alpha"], 60)
    ledger.finish(engine, done.run_id, rid, FinishParams("SUCCESS"))
    run = client.post(f"{W}/alpha/runs", headers=admin_headers, json={}).json()
    ledger.claim_next(engine, rid, ["alpha"], 60)
    ledger.heartbeat(engine, rid, 60, progress={run["run_id"]: {"done": 3, "total": 10, "unit": "document"}})
    alpha = _worker(client, admin_headers, "alpha")
    assert alpha["active_run"]["status"] == "RUNNING"
    assert alpha["active_run"]["progress"] == {"done": 3, "total": 10, "unit": "document"}
    assert alpha["last_run"]["run_id"] == str(done.run_id) and alpha["last_run"]["status"] == "SUCCESS"
    assert [r["name"] for r in alpha["runners"]] == ["gpu-1"]
    assert alpha["runners"][0]["busy"] is True and alpha["queued_reason"] is None


def test_why_a_queued_run_is_not_running(client, admin_headers, engine):
    client.post(f"{W}/alpha/runs", headers=admin_headers, json={})
    assert _worker(client, admin_headers, "alpha")["queued_reason"]["code"] == "no_runner"

    rid = register_runner(engine, ["beta", "alpha"], name="busy-one")
    client.post(f"{W}/beta/runs", headers=admin_headers, json={})
    # the runner claims beta (older) and, with concurrency 1, is busy for alpha
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET queued_at = queued_at - interval '1 minute' "
                          "WHERE worker_name = 'beta'"))
    claimed = ledger.claim_next(engine, rid, ["beta", "alpha"], 60)
    assert claimed.worker_name == "beta"
    assert _worker(client, admin_headers, "alpha")["queued_reason"]["code"] == "runners_busy"

    ledger.finish(engine, claimed.run_id, rid, FinishParams("SUCCESS"))
    assert _worker(client, admin_headers, "alpha")["queued_reason"]["code"] == "waiting_for_claim"

    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runners SET schema_revision = '0000_old'"))
    assert _worker(client, admin_headers, "alpha")["queued_reason"]["code"] == "schema_behind"

    registry.request_drain(engine, rid, "test")
    assert _worker(client, admin_headers, "alpha")["queued_reason"]["code"] == "draining"

    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = now() + interval '5 minutes' "
                          "WHERE worker_name = 'alpha' AND status = 'QUEUED'"))
    reason = _worker(client, admin_headers, "alpha")["queued_reason"]
    assert reason["code"] == "backing_off" and reason["not_before"] is not None

    registry.stop(engine, rid)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = NULL"))
    assert _worker(client, admin_headers, "alpha")["queued_reason"]["code"] == "no_runner"


def test_runners_and_drain(client, admin_headers, viewer_headers, engine):
    rid = register_runner(engine, ["alpha"], name="gpu-2")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runners SET children = '[{\"pid\": 42, \"run\": \"x\"}]'"))
    stale = register_runner(engine, ["beta"], name="old", lease=1, heartbeat=0.25)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runners SET last_heartbeat_at = now() - interval '1 hour' "
                          "WHERE runner_id = :r"), {"r": stale})
    body = client.get("/api/v1/system/runners", headers=viewer_headers).json()
    by = {r["name"]: r for r in body["runners"]}
    assert by["gpu-2"]["state"] == "online" and by["old"]["state"] == "stale"
    assert by["gpu-2"]["children"] == [{"pid": 42, "run": "x"}] and by["gpu-2"]["capabilities"] == ["alpha"]
    assert by["gpu-2"]["schema_mismatch"] is False
    r = client.post(f"/api/v1/system/runners/{rid}/drain", headers=admin_headers)
    assert r.status_code == 202 and r.json()["drain_requested_at"] is not None
    assert client.post(f"/api/v1/system/runners/{uuid.uuid4()}/drain", headers=admin_headers).status_code == 404
    registry.stop(engine, rid)
    r = client.post(f"/api/v1/system/runners/{rid}/drain", headers=admin_headers)
    assert r.status_code == 409


def test_settings_put_delete_and_revisions(client, admin_headers, viewer_headers):
    s = f"{W}/alpha/settings"
    assert client.get(s, headers=viewer_headers).json()["persisted"] is None
    r = client.put(s, headers=admin_headers, json={"engine_name": "large", "options": {"threshold": 0.8},
                                                   "engine_options": {"api_token": "s3cr3t-value"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["persisted"]["revision"] == 1 and body["effective"]["engine_name"] == "large"
    assert body["effective"]["sources"]["engine_name"] == "persisted"
    assert "s3cr3t-value" not in r.text  # secret-looking values are masked in answers
    # the next run follows the settings
    alpha = _worker(client, viewer_headers, "alpha")
    assert alpha["settings"]["effective"]["options"] == {"threshold": 0.8}
    # a bad value is 422 per field, and nothing is written
    r = client.put(s, headers=admin_headers, json={"engine_name": "huge"})
    assert r.status_code == 422 and "engine_name" in r.json()["fields"]
    # optimistic concurrency
    r = client.put(s, headers=admin_headers, json={"db_batch_size": 16, "expected_revision": 7})
    assert r.status_code == 409 and r.json()["revision"] == 1
    r = client.put(s, headers=admin_headers, json={"db_batch_size": 16, "expected_revision": 1})
    assert r.status_code == 200 and r.json()["persisted"]["revision"] == 2
    r = client.delete(s, headers=admin_headers)
    assert r.status_code == 200 and r.json()["persisted"] is None
    assert r.json()["effective"]["engine_name"] == "small"
    assert client.delete(s, headers=admin_headers).status_code == 404
    revisions = client.get(f"{s}/revisions", headers=viewer_headers).json()["revisions"]
    assert [(x["revision"], x["action"]) for x in revisions] == [(3, "DELETE"), (2, "PUT"), (1, "PUT")]
    assert revisions[2]["changed_by"] == "admin@example.org"
    assert "s3cr3t-value" not in client.get(f"{s}/revisions", headers=viewer_headers).text
    assert client.get(f"{W}/nope/settings", headers=viewer_headers).status_code == 404


def test_metrics_in_prometheus_text(client, admin_headers, engine):
    client.post(f"{W}/alpha/runs", headers=admin_headers, json={})
    register_runner(engine, ["alpha"])
    r = client.get("/metrics", headers=admin_headers)  # an ADMIN session (or API_METRICS_TOKEN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("scrinalia_worker_runs_active", (("status", "QUEUED"), ("worker", "alpha")))] == 1
    assert samples[("scrinalia_runners", (("state", "online"),))] == 1
    assert families["scrinalia_worker_units"].type == "gauge"


def test_counts_are_served_stale_while_one_thread_refreshes_them(engine):
    import time as _time

    from scrinalia.api import catalogue_view
    from tests.api.workers_fixture import WORKERS

    catalogue = {w.name: w for w in WORKERS}
    cache = catalogue_view.CountsCache(max_age_seconds=0.2)
    first, as_of = cache.get(engine, catalogue)
    assert first["alpha"]["pending"] == 0 and as_of is not None
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_documents (reference_code, title) VALUES ('X1', 't')"))
    assert cache.get(engine, catalogue)[0]["alpha"]["pending"] == 0  # fresh enough: served as is
    _time.sleep(0.3)
    assert cache.get(engine, catalogue)[0]["alpha"]["pending"] == 0  # stale: served, refresh started
    deadline = _time.monotonic() + 10
    while cache.get(engine, catalogue)[0]["alpha"]["pending"] != 1:
        assert _time.monotonic() < deadline
        _time.sleep(0.05)


def test_a_newer_release_s_revision_action_passes_through_as_it_is(client, admin_headers, engine):
    """A wider CHECK of a newer release (decision 0125) is answered as it is (decision 0393), not a 500."""
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE archive_worker_setting_revisions DROP CONSTRAINT ck_setting_revision_action"))
        conn.execute(text("ALTER TABLE archive_worker_setting_revisions ADD CONSTRAINT ck_setting_revision_action "
                          "CHECK (action IN ('PUT', 'DELETE', 'RESTORE'))"))
        conn.execute(text("INSERT INTO archive_worker_setting_revisions (worker_name, revision, action, settings) "
                          "VALUES ('alpha', 1, 'RESTORE', '{}'::jsonb)"))
    r = client.get(f"{W}/alpha/settings/revisions", headers=admin_headers)
    assert r.status_code == 200, r.text
    assert [x["action"] for x in r.json()["revisions"]] == ["RESTORE"]
