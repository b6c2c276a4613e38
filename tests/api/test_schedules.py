"""/system/schedules: list for any session, writes for ADMIN, requests validated like a run's."""
from __future__ import annotations

from scrinalia.domains.archive import ledger
from scrinalia.scheduler.service import Scheduler

S = "/api/v1/system/schedules"


def test_schedule_lifecycle(client, engine, admin_headers, viewer_headers):
    r = client.post(S, headers=admin_headers,
                    json={"worker_name": "alpha", "interval_seconds": 3600, "request": {"db_batch_size": 8}})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["enabled"] and created["request"] == {"db_batch_size": 8} and created["last_outcome"] is None

    listed = client.get(S, headers=viewer_headers)
    assert listed.status_code == 200 and [s["id"] for s in listed.json()["schedules"]] == [created["id"]]

    (fired,) = Scheduler(engine).tick().fired
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
    assert unknown.status_code == 404
    too_often = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 10})
    assert too_often.status_code == 422 and "interval_seconds" in too_often.json()["fields"]
    bad_request = client.post(S, headers=admin_headers,
                              json={"worker_name": "alpha", "interval_seconds": 3600, "request": {"db_batch_size": 0}})
    assert bad_request.status_code == 422 and "request.db_batch_size" in bad_request.json()["fields"]
    assert client.get(S, headers=admin_headers).json()["schedules"] == []


def test_a_viewer_cannot_write_schedules(client, viewer_headers):
    r = client.post(S, headers=viewer_headers, json={"worker_name": "alpha", "interval_seconds": 3600})
    assert r.status_code == 403
