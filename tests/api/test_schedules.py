"""/system/schedules: list for any session, writes for ADMIN, requests validated like a run's."""
from __future__ import annotations

from scrinalia.domains.archive import ledger
from scrinalia.scheduler.service import Scheduler
from tests.api.workers_fixture import WORKERS

S = "/api/v1/system/schedules"


def test_schedule_lifecycle(client, engine, admin_headers, viewer_headers):
    r = client.post(S, headers=admin_headers,
                    json={"worker_name": "alpha", "interval_seconds": 3600, "request": {"db_batch_size": 8}})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["enabled"] and created["request"] == {"db_batch_size": 8} and created["last_outcome"] is None

    listed = client.get(S, headers=viewer_headers)
    assert listed.status_code == 200 and [s["id"] for s in listed.json()["schedules"]] == [created["id"]]

    (fired,) = Scheduler(engine, {w.name: w for w in WORKERS}).tick().fired
    assert fired.run_id is not None
    run = ledger.get_run(engine, fired.run_id)
    assert run.trigger == "SCHEDULE" and run.schedule_id == created["id"] and run.request == {"db_batch_size": 8}
    assert client.get(S, headers=viewer_headers).json()["schedules"][0]["last_outcome"] == "enqueued"

    r = client.patch(f"{S}/{created['id']}", headers=admin_headers, json={"enabled": False})
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert client.delete(f"{S}/{created['id']}", headers=admin_headers).status_code == 204
    assert client.delete(f"{S}/{created['id']}", headers=admin_headers).status_code == 404
    assert client.patch(f"{S}/{created['id']}", headers=admin_headers, json={"enabled": True}).status_code == 404
    assert ledger.get_run(engine, fired.run_id).schedule_id is None  # the run's history stays


def test_bad_schedules_are_refused_per_field(client, admin_headers):
    unknown = client.post(S, headers=admin_headers, json={"worker_name": "nope", "interval_seconds": 3600})
    assert unknown.status_code == 422 and "no worker named 'nope'" in unknown.json()["fields"]["worker_name"]
    too_often = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 10})
    assert too_often.status_code == 422 and "interval_seconds" in too_often.json()["fields"]
    bad_request = client.post(S, headers=admin_headers,
                              json={"worker_name": "alpha", "interval_seconds": 3600, "request": {"db_batch_size": 0}})
    assert bad_request.status_code == 422 and "request.db_batch_size" in bad_request.json()["fields"]
    assert client.get(S, headers=admin_headers).json()["schedules"] == []


def test_a_viewer_cannot_write_schedules(client, viewer_headers):
    r = client.post(S, headers=viewer_headers, json={"worker_name": "alpha", "interval_seconds": 3600})
    assert r.status_code == 403


def test_a_second_schedule_for_a_worker_is_refused(client, admin_headers):
    first = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 3600})
    assert first.status_code == 201
    second = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 600})
    assert second.status_code == 409 and second.json()["schedule_id"] == first.json()["id"]
    assert len(client.get(S, headers=admin_headers).json()["schedules"]) == 1


def test_disabling_a_schedule_cancels_what_it_left_queued(client, engine, admin_headers):
    created = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 3600}).json()
    queued = ledger.enqueue(engine, "alpha", {}, trigger="SCHEDULE", schedule_id=created["id"], attempt=2,
                            not_before_delay_s=600)  # a retry waiting out its backoff holds the slot
    assert client.patch(f"{S}/{created['id']}", headers=admin_headers, json={"enabled": False}).status_code == 200
    assert ledger.get_run(engine, queued.run_id).status == "CANCELLED"
    assert ledger.active_run(engine, "alpha") is None


def test_a_quarantined_schedule_is_shown_and_resumed_by_one_call(client, engine, admin_headers, viewer_headers):
    from sqlalchemy import text

    created = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 3600}).json()
    with engine.begin() as conn:  # as the scheduler quarantines it (tests/scheduler/test_quarantine.py)
        conn.execute(text("UPDATE archive_worker_schedules SET enabled = false, quarantined_at = now(), "
                          "quarantine_reason = 'crash loop', quarantine_fingerprint = 'valueerror: boom' "
                          "WHERE id = :i"), {"i": created["id"]})
    (listed,) = client.get(S, headers=viewer_headers).json()["schedules"]
    assert listed["quarantined"] and listed["quarantine"]["fingerprint"] == "valueerror: boom"
    assert listed["quarantine"]["schedule_id"] == created["id"] and listed["quarantine"]["reason"] == "crash loop"
    workers = {w["name"]: w for w in client.get("/api/v1/system/workers", headers=viewer_headers).json()["workers"]}
    assert workers["alpha"]["quarantine"]["fingerprint"] == "valueerror: boom"
    assert workers["beta"]["quarantine"] is None

    assert client.post(f"{S}/{created['id']}/resume", headers=viewer_headers).status_code == 403
    r = client.post(f"{S}/{created['id']}/resume", headers=admin_headers)
    assert r.status_code == 200, r.text
    assert r.json()["enabled"] and not r.json()["quarantined"] and r.json()["quarantine"] is None
    assert r.json()["quarantine_resumed_by"] == "admin@example.org"
    again = client.post(f"{S}/{created['id']}/resume", headers=admin_headers)
    assert again.status_code == 409 and again.json()["error"] == "not_quarantined"
    assert client.post(f"{S}/999999/resume", headers=admin_headers).status_code == 404
    assert client.get("/api/v1/system/workers", headers=viewer_headers).json()["workers"][0]["quarantine"] is None
