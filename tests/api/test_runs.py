"""Enqueue (201/404/409/422), cancel (200/202/409/404), the runs list, one run and its attempts, failures."""
from __future__ import annotations

import uuid

from sqlalchemy import text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from tests.ledger.helpers import register_runner

W = "/api/v1/system/workers"
R = "/api/v1/system/runs"


def test_enqueue_answers_201_with_the_queued_run(client, admin_headers):
    r = client.post(f"{W}/alpha/runs", headers=admin_headers,
                    json={"engine_name": "large", "preset": "gpu", "db_batch_size": 8, "options": {"threshold": 0.9}})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "QUEUED" and run["worker_name"] == "alpha" and run["trigger"] == "API"
    assert run["requested_by"] == "admin@example.org"
    assert run["request"] == {"engine_name": "large", "preset": "gpu", "db_batch_size": 8,
                              "options": {"threshold": 0.9}}
    assert r.headers["location"] == f"{R}/{run['run_id']}"


def test_an_empty_body_is_a_default_run(client, admin_headers):
    r = client.post(f"{W}/beta/runs", headers=admin_headers)
    assert r.status_code == 201, r.text
    assert r.json()["request"] == {}


def test_enqueue_an_unknown_worker_is_404(client, admin_headers):
    r = client.post(f"{W}/nope/runs", headers=admin_headers, json={})
    assert r.status_code == 404 and r.json()["error"] == "not_found"


def test_a_second_request_while_the_slot_is_taken_is_409_with_the_active_run(client, admin_headers):
    first = client.post(f"{W}/alpha/runs", headers=admin_headers, json={}).json()
    r = client.post(f"{W}/alpha/runs", headers=admin_headers, json={"db_batch_size": 4})
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "run_active" and body["active_run"]["run_id"] == first["run_id"]


def test_422_names_each_bad_field(client, admin_headers):
    cases = [
        ({"engine_name": "huge"}, "engine_name"),
        ({"preset": "turbo"}, "preset"),
        ({"db_batch_size": 0}, "db_batch_size"),
        ({"db_batch_size": 10_001}, "db_batch_size"),
        ({"db_batch_size": "many"}, "db_batch_size"),
        ({"options": {"threshold": 7}}, "options.threshold"),
        ({"options": {"colour": "red"}}, "options.colour"),
        ({"engine_options": {"device": "tpu"}}, "engine_options.device"),
        ({"engine_options": {"config": {}}}, "engine_options.config"),
        ({"surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        r = client.post(f"{W}/alpha/runs", headers=admin_headers, json=body)
        assert r.status_code == 422, (body, r.text)
        assert field in r.json()["fields"], (body, r.json())
    r = client.post(f"{W}/beta/runs", headers=admin_headers, json={"engine_name": "small"})
    assert r.status_code == 422 and "engine_name" in r.json()["fields"]
    # nothing was written
    assert client.get(R, headers=admin_headers).json()["runs"] == []


def test_cancel_an_unclaimed_run_is_200_and_cancelled_at_once(client, admin_headers):
    run = client.post(f"{W}/alpha/runs", headers=admin_headers, json={}).json()
    r = client.post(f"{R}/{run['run_id']}/cancel", headers=admin_headers)
    assert r.status_code == 200, r.text
    assert r.json()["cancelled"] is True and r.json()["run"]["status"] == "CANCELLED"
    # the slot is free again
    assert client.post(f"{W}/alpha/runs", headers=admin_headers, json={}).status_code == 201


def test_cancel_a_running_run_is_202_and_a_request(client, admin_headers, engine):
    run = client.post(f"{W}/alpha/runs", headers=admin_headers, json={}).json()
    runner_id = register_runner(engine, ["alpha"])
    claimed = ledger.claim_next(engine, runner_id, ["alpha"], 60)
    assert str(claimed.run_id) == run["run_id"]
    r = client.post(f"{R}/{run['run_id']}/cancel", headers=admin_headers)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["cancelled"] is False and body["run"]["status"] == "RUNNING"
    assert body["run"]["cancel_requested_at"] is not None
    # asking again is still 202 (the request stands), and a finished run is 409 with the run
    assert client.post(f"{R}/{run['run_id']}/cancel", headers=admin_headers).status_code == 202
    ledger.finish(engine, claimed.run_id, runner_id, FinishParams("CANCELLED", exit_reason="cancelled"))
    r = client.post(f"{R}/{run['run_id']}/cancel", headers=admin_headers)
    assert r.status_code == 409 and r.json()["error"] == "run_finished"
    assert r.json()["run"]["status"] == "CANCELLED"


def test_cancel_an_unknown_run_is_404(client, admin_headers):
    assert client.post(f"{R}/{uuid.uuid4()}/cancel", headers=admin_headers).status_code == 404
    assert client.post(f"{R}/not-a-uuid/cancel", headers=admin_headers).status_code == 422


def _finished_run(engine, worker, status="FAILED", error=None, trigger="API", retry_of=None, attempt=1):
    run = ledger.enqueue(engine, worker, {}, trigger=trigger, retry_of=retry_of, attempt=attempt)
    runner_id = register_runner(engine, [worker])
    ledger.claim_next(engine, runner_id, [worker], 60)
    return ledger.finish(engine, run.run_id, runner_id, FinishParams(status, error=error,
                         exit_reason="exception" if error else None))


def test_the_runs_list_filters_and_pages_by_keyset(client, admin_headers, engine):
    for _ in range(5):
        _finished_run(engine, "alpha", "SUCCESS")
    for i in range(3):
        _finished_run(engine, "beta", "FAILED", error=f"ValueError: bad row {i} in /tmp/file{i}.csv")
    _finished_run(engine, "beta", "SUCCESS", trigger="SCHEDULE")
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get(R, headers=admin_headers, params=params).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 9 and seen == sorted(seen, reverse=True)
    beta = client.get(R, headers=admin_headers, params={"worker": "beta"}).json()["runs"]
    assert {r["worker_name"] for r in beta} == {"beta"}
    failed = client.get(R, headers=admin_headers, params={"status": "FAILED"}).json()["runs"]
    assert len(failed) == 3
    both = client.get(R, headers=admin_headers, params=[("status", "FAILED"), ("status", "SUCCESS")]).json()["runs"]
    assert len(both) == 9
    fp = failed[0]["error_fingerprint"]
    assert fp == "valueerror: bad row <n> in <path>"
    assert len(client.get(R, headers=admin_headers, params={"fingerprint": fp}).json()["runs"]) == 3
    sched = client.get(R, headers=admin_headers, params={"trigger": "SCHEDULE"}).json()["runs"]
    assert len(sched) == 1 and sched[0]["trigger"] == "SCHEDULE"
    assert client.get(R, headers=admin_headers, params={"cursor": "abc"}).status_code == 422
    assert client.get(R, headers=admin_headers, params={"status": "BOGUS"}).status_code == 422


def test_one_run_with_its_chain_of_attempts(client, admin_headers, engine):
    first = _finished_run(engine, "alpha", "FAILED", error="RuntimeError: boom", trigger="SCHEDULE")
    second = _finished_run(engine, "alpha", "INTERRUPTED", error="LeaseExpired: gone", trigger="SCHEDULE",
                           retry_of=first.run_id, attempt=2)
    third = ledger.enqueue(engine, "alpha", {}, trigger="SCHEDULE", retry_of=second.run_id, attempt=3,
                           not_before_delay_s=120)
    for run in (first, second, third):
        r = client.get(f"{R}/{run.run_id}", headers=admin_headers)
        assert r.status_code == 200, r.text
        attempts = r.json()["attempts"]
        assert [a["attempt"] for a in attempts] == [1, 2, 3]
        assert [a["run_id"] for a in attempts] == [str(first.run_id), str(second.run_id), str(third.run_id)]
    detail = client.get(f"{R}/{second.run_id}", headers=admin_headers).json()
    assert detail["runner"]["state"] == "online" and detail["retry_of"] == str(first.run_id)
    assert client.get(f"{R}/{uuid.uuid4()}", headers=admin_headers).status_code == 404


def test_failures_are_grouped_by_fingerprint(client, admin_headers, engine):
    _finished_run(engine, "alpha", "FAILED", error="OSError: cannot open /data/a.bin")
    _finished_run(engine, "beta", "FAILED", error="OSError: cannot open /data/b.bin")
    _finished_run(engine, "alpha", "FAILED", error="KeyError: 'x'")
    old = _finished_run(engine, "alpha", "FAILED", error="TimeoutError: 40 s")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET finished_at = now() - interval '40 days' WHERE run_id = :r"),
                     {"r": old.run_id})
    body = client.get("/api/v1/system/failures", headers=admin_headers, params={"days": 30}).json()
    groups = {g["fingerprint"]: g for g in body["failures"]}
    assert set(groups) == {"oserror: cannot open <path>", "keyerror: 'x'"}
    g = groups["oserror: cannot open <path>"]
    assert g["occurrences"] == 2 and g["workers"] == ["alpha", "beta"]
    assert g["sample_error"] == "OSError: cannot open …/b.bin" and g["first_seen"] <= g["last_seen"]
    body = client.get("/api/v1/system/failures", headers=admin_headers, params={"days": 60}).json()
    assert len(body["failures"]) == 3
    assert client.get("/api/v1/system/failures", headers=admin_headers, params={"days": 0}).status_code == 422


def test_retry_a_failed_or_interrupted_run_is_a_new_row_with_retry_of(client, admin_headers, viewer_headers, engine):
    failed = _finished_run(engine, "alpha", "FAILED", error="RuntimeError: boom")
    assert client.post(f"{R}/{failed.run_id}/retry", headers=viewer_headers).status_code == 403
    r = client.post(f"{R}/{failed.run_id}/retry", headers=admin_headers)
    assert r.status_code == 201, r.text
    retry = r.json()
    assert retry["status"] == "QUEUED" and retry["retry_of"] == str(failed.run_id) and retry["attempt"] == 2
    assert retry["trigger"] == "API" and retry["request"] == failed.request
    assert r.headers["location"] == f"{R}/{retry['run_id']}"
    # the slot is now the retry's: a second retry is 409 with the active run
    again = client.post(f"{R}/{failed.run_id}/retry", headers=admin_headers)
    assert again.status_code == 409 and again.json()["active_run"]["run_id"] == retry["run_id"]
    client.post(f"{R}/{retry['run_id']}/cancel", headers=admin_headers)
    # CANCELLED (on purpose) and SUCCESS are not retried; an unknown run is 404
    cancelled = client.post(f"{R}/{retry['run_id']}/retry", headers=admin_headers)
    assert cancelled.status_code == 409 and cancelled.json()["error"] == "run_not_retryable"
    assert client.post(f"{R}/{uuid.uuid4()}/retry", headers=admin_headers).status_code == 404
    interrupted = _finished_run(engine, "beta", "INTERRUPTED", error="LeaseExpired: gone")
    assert client.post(f"{R}/{interrupted.run_id}/retry", headers=admin_headers).status_code == 201


def test_a_retry_is_validated_again(client, admin_headers, engine):
    # the request was valid when it ran; the worker's engine options have changed since (an option the
    # engine no longer knows, written around the validation): the retry is refused and writes nothing
    failed = _finished_run(engine, "alpha", "FAILED", error="RuntimeError: boom")
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET request = '{\"options\": {\"gone\": 1}}' WHERE run_id = :r"),
                     {"r": failed.run_id})
    r = client.post(f"{R}/{failed.run_id}/retry", headers=admin_headers)
    assert r.status_code == 422 and "options.gone" in r.json()["fields"]
    assert ledger.active_run(engine, "alpha") is None


def test_a_viewer_sees_the_cause_in_words_never_a_traceback_or_a_server_path(client, viewer_headers, engine,
                                                                              tmp_path):
    """Issue 28 item 8: a run whose model folder is missing fails with the engine's own error and the
    traceback the runner writes to the ledger (``runner.outcome.format_error``, as the child reports it).
    The Failures page's data, the run, its attempts and the worker's last run carry the cause in words;
    the traceback and the server's paths stay in the ledger and the runner's log."""
    from runner.outcome import format_error
    from scrinalia.domains.archive.workers.engines.common import require_model_dir

    missing = tmp_path / "models" / "ner-model"
    try:
        require_model_dir(str(missing), "ner")
    except Exception as exc:  # as the child reports it: ExceptionClass: message, then the traceback
        error = format_error(exc)
    assert "Traceback" in error and str(missing) in error and str(tmp_path) in error  # the ledger keeps it all
    run = _finished_run(engine, "alpha", "FAILED", error=error)

    shown = [client.get("/api/v1/system/failures", headers=viewer_headers).json()["failures"][0]["sample_error"]]
    detail = client.get(f"{R}/{run.run_id}", headers=viewer_headers).json()
    shown += [detail["error"], *(a["error"] for a in detail["attempts"])]
    shown += [r["error"] for r in client.get(R, headers=viewer_headers).json()["runs"]]
    alpha = client.get("/api/v1/system/workers/alpha", headers=viewer_headers).json()
    shown += [alpha["last_run"]["error"]]
    assert len(shown) == 5
    for text_shown in shown:
        assert text_shown == ("EngineUnavailable: engine_options.model: ner: …/ner-model is not a local model "
                              "directory on this host (no config.json)"), text_shown
        assert "Traceback" not in text_shown and str(tmp_path) not in text_shown and ".py" not in text_shown


def test_a_run_started_in_the_panel_is_listed_with_trigger_panel(client, engine):
    """Issue 28 item 7: the panel's Run and Retry (the browser's cookie session) write trigger PANEL; a
    script's bearer token writes API. The field keeps its name; the runs list filters by it."""
    from tests.api.conftest import add_user, bearer, cookie_login

    add_user(engine, "admin@example.org", "ADMIN")
    token = bearer(client, "admin@example.org")
    csrf = cookie_login(client, "admin@example.org")  # the client now also holds the panel's cookie
    r = client.post("/api/v1/system/workers/alpha/runs", headers={"X-CSRF-Token": csrf}, json={})
    assert r.status_code == 201, r.text
    assert r.json()["trigger"] == "PANEL"
    ledger.request_cancel(engine, uuid.UUID(r.json()["run_id"]))
    r = client.post("/api/v1/system/workers/alpha/runs", headers=token, json={})
    assert r.status_code == 201 and r.json()["trigger"] == "API"
    ledger.request_cancel(engine, uuid.UUID(r.json()["run_id"]))
    failed = _finished_run(engine, "beta", "FAILED", error="RuntimeError: boom")
    r = client.post(f"{R}/{failed.run_id}/retry", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 201 and r.json()["trigger"] == "PANEL"
    panel = client.get(R, params={"trigger": "PANEL"}).json()["runs"]
    assert sorted(run["worker_name"] for run in panel) == ["alpha", "beta"]


def test_a_newer_release_s_trigger_and_status_pass_through_as_they_are(client, admin_headers, engine):
    """Through an upgrade's window, and on a newer schema that declares it compatible (decision 0392), this
    API reads rows a newer release wrote: an enum label or a CHECK value it added (additive, decision 0125)
    is answered as it is, not a 500 of the whole list (decision 0393)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ALTER TYPE worker_run_trigger ADD VALUE IF NOT EXISTS 'WEBHOOK'"))
        conn.execute(text("ALTER TYPE worker_run_status ADD VALUE IF NOT EXISTS 'PAUSED'"))
    run = ledger.enqueue(engine, "alpha", {})
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET trigger = 'WEBHOOK', status = 'PAUSED' WHERE run_id = :r"),
                     {"r": run.run_id})
    listed = client.get(R, headers=admin_headers)
    assert listed.status_code == 200, listed.text
    mine = [r for r in listed.json()["runs"] if r["run_id"] == str(run.run_id)]
    assert [(r["trigger"], r["status"]) for r in mine] == [("WEBHOOK", "PAUSED")]
    one = client.get(f"{R}/{run.run_id}", headers=admin_headers)
    assert one.status_code == 200, one.text
    assert one.json()["attempts"][0]["status"] == "PAUSED"
