"""Inputs PostgreSQL cannot store are a 422 naming the field, and nothing is written; request schemas
are strict (no bool or string coerced into an integer)."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

W = "/api/v1/system/workers"
S = "/api/v1/system/schedules"

TABLES = ("archive_worker_runs", "archive_worker_settings", "archive_worker_setting_revisions",
          "archive_worker_schedules")


def _written(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


@pytest.mark.parametrize("path, field", [
    ("/api/v1/system/runs?worker=a%00b", "worker"),
    ("/api/v1/system/failures?worker=a%00b", "worker"),
    ("/api/v1/system/runs?fingerprint=%00", "fingerprint"),
    ("/api/v1/system/runs?status=QUEUED&worker=%00", "worker"),
    ("/api/v1/system/workers/al%00pha", "name"),
])
def test_a_nul_in_a_query_or_path_parameter_is_a_422(client, admin_headers, path, field):
    r = client.get(path, headers=admin_headers)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_failed" and "NUL" in r.json()["fields"][field]


def test_a_cursor_of_unicode_digits_is_a_422(client, admin_headers):
    r = client.get("/api/v1/system/runs", params={"cursor": "²"}, headers=admin_headers)
    assert r.status_code == 422 and "cursor" in r.json()["fields"]


@pytest.mark.parametrize("body, field", [
    ({"db_batch_size": True}, "db_batch_size"),
    ({"db_batch_size": "10"}, "db_batch_size"),
    ({"db_batch_size": 4.0}, "db_batch_size"),
    ({"engine_name": "sm\u0000all"}, "engine_name"),
    ({"options": {"threshold": "a\u0000b"}}, "options"),
    ({"options": {"x\u0000": 1}}, "options"),
    ({"engine_options": {"api_token": "t\u0000k"}}, "engine_options"),
    ({"engine_options": {"nested": {"deep": ["ok", "n\u0000ul"]}}}, "engine_options"),
    ({"options": {"threshold": float("nan")}}, "options"),
    ({"options": {"threshold": float("inf")}}, "options"),
])
def test_unstorable_or_loosely_typed_run_requests_are_a_422_and_write_nothing(client, admin_headers, engine,
                                                                               body, field):
    before = _written(engine)
    for method, path in (("POST", f"{W}/alpha/runs"), ("PUT", f"{W}/alpha/settings")):
        r = client.request(method, path, headers={**admin_headers, "Content-Type": "application/json"},
                           content=json.dumps(body))
        assert r.status_code == 422, (method, r.text)
        assert field in r.json()["fields"], r.json()
    r = client.post(S, headers=admin_headers, content=json.dumps({"worker_name": "alpha", "interval_seconds": 3600,
                                                                   "request": body}))
    assert r.status_code == 422, r.text
    assert _written(engine) == before


def test_a_lone_surrogate_is_a_422(client, admin_headers, engine):
    raw = '{"options": {"threshold": "\\ud800"}}'  # valid JSON, not storable text
    r = client.post(f"{W}/alpha/runs", headers={**admin_headers, "Content-Type": "application/json"}, content=raw)
    assert r.status_code == 422 and "Unicode" in r.json()["fields"]["options"]
    assert _written(engine)["archive_worker_runs"] == 0


@pytest.mark.parametrize("body, field", [
    ({"worker_name": "alpha", "interval_seconds": "3600"}, "interval_seconds"),
    ({"worker_name": "alpha", "interval_seconds": True}, "interval_seconds"),
    ({"worker_name": "al\u0000pha", "interval_seconds": 3600}, "worker_name"),
    ({"worker_name": "alpha", "interval_seconds": 3600, "first_delay_seconds": "5"}, "first_delay_seconds"),
])
def test_schedules_are_strict(client, admin_headers, engine, body, field):
    r = client.post(S, headers=admin_headers, json=body)
    assert r.status_code == 422 and field in r.json()["fields"], r.text
    assert _written(engine)["archive_worker_schedules"] == 0


def test_strict_booleans(client, admin_headers, engine):
    r = client.post(S, headers=admin_headers, json={"worker_name": "alpha", "interval_seconds": 3600})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for value in ("false", 0):
        r = client.patch(f"{S}/{sid}", headers=admin_headers, json={"enabled": value})
        assert r.status_code == 422 and "enabled" in r.json()["fields"]
    assert client.post("/api/v1/auth/login", json={"email": "x@example.org", "password": "p" * 12,
                                                   "issue_token": "true"}).status_code == 422


def test_a_nul_in_the_login_is_a_422_not_a_500(client, engine):
    for body in ({"email": "a\u0000@example.org", "password": "whatever it is"},
                 {"email": "a@example.org", "password": "what\u0000ever"}):
        r = client.post("/api/v1/auth/login", json=body)
        assert r.status_code == 422, r.text
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM auth_login_throttle")).scalar_one() == 0
