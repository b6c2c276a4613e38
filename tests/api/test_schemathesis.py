"""Property-based requests from the OpenAPI schema, authenticated as an ADMIN: no answer is a 5xx, every
status code is documented and every documented answer matches its schema. Twice: in-process (ASGI), and
against a running `uvicorn --workers 2` over HTTP, where the bytes on the wire (a NUL in a query, say)
are what a client really sends. Bounded (a few examples per operation) to stay well under 2 minutes each.
Driven through schemathesis' Python API (its pytest plugin does not run under pytest 9)."""
from __future__ import annotations

from collections.abc import Callable

import httpx
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.api.conftest import PASSWORD, add_user
from tests.api.live import live_api

MAX_EXAMPLES = 10
SKIP = {("POST", "/api/v1/auth/logout")}  # would revoke the session the other examples use
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


def _fuzz(schema, call: Callable) -> None:
    tested = []
    calls = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in SKIP:
            continue

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            response = call(case)
            calls.append(response.status_code)
            case.validate_response(response, checks=CHECKS)

        check()
        tested.append(f"{operation.method.upper()} {operation.path}")
    assert len(tested) >= 18, tested
    assert len(calls) >= 5 * len(tested) and all(c < 500 for c in calls)


def test_no_server_error_and_answers_match_the_schema(app, engine):
    add_user(engine, "fuzz@example.org", "ADMIN")
    with TestClient(app) as client:
        token = client.post("/api/v1/auth/login", json={"email": "fuzz@example.org", "password": PASSWORD,
                                                        "issue_token": True}).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    _fuzz(schemathesis.openapi.from_asgi("/api/v1/openapi.json", app), lambda case: case.call(headers=headers))


def test_no_server_error_from_a_running_api(database_url, engine):
    add_user(engine, "fuzz@example.org", "ADMIN")
    # API_EVENTS_STREAM_SECONDS=0: the live-panel stream answers its hello and ends, as in-process.
    with live_api(database_url, workers=2, API_LOGIN_RATE_LIMIT="10000", API_EVENTS_STREAM_SECONDS="0") as api:
        r = httpx.post(f"{api.base}/api/v1/auth/login", timeout=30,
                       json={"email": "fuzz@example.org", "password": PASSWORD, "issue_token": True})
        assert r.status_code == 200, r.text
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        schema = schemathesis.openapi.from_url(f"{api.base}/api/v1/openapi.json")
        _fuzz(schema, lambda case: case.call(base_url=api.base, headers=headers, timeout=30))
        assert "Traceback" not in api.log() and "unhandled" not in api.log()
