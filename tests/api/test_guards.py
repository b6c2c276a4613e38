"""Every /system route needs a session, and every OPERATE route the ADMIN role and (with the cookie) the
CSRF token. The route table is walked, so a new route cannot forget its guard."""
from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from scrinalia.api.app import SYSTEM_PREFIX, api_routes, assert_system_routes_guarded
from scrinalia.api.security import SAFE_METHODS
from tests.api.conftest import add_user, cookie_login

PARAMS = {"name": "alpha", "run_id": str(uuid.uuid4()), "runner_id": str(uuid.uuid4()), "schedule_id": "1"}


def system_calls(app):
    calls = []
    for route_path, methods, _ in api_routes(app):
        if route_path.startswith(SYSTEM_PREFIX):
            path = re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], route_path)
            for method in sorted(methods):
                calls.append((method, path))
    return calls


def _send(client, method, path, **kw):
    body: dict[str, Any] | None = {} if method in ("POST", "PUT", "PATCH") else None
    return client.request(method, path, json=body, **kw)


def test_the_route_table_has_the_expected_system_routes(app):
    calls = system_calls(app)
    assert len(calls) >= 12
    operate = [c for c in calls if c[0] not in SAFE_METHODS]
    assert {m for m, _ in operate} == {"POST", "PUT", "PATCH", "DELETE"}
    # enqueue, cancel, retry, drain, settings put/delete, schedule post/patch/delete/resume
    assert len(operate) == 10


def test_anonymous_gets_401_on_every_system_route(client, app):
    for method, path in system_calls(app):
        r = _send(client, method, path)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        assert r.json()["error"] == "unauthenticated"


def test_a_bad_or_revoked_token_is_anonymous(client, app, engine, viewer_headers):
    r = client.get(f"{SYSTEM_PREFIX}/workers", headers={"Authorization": "Bearer not-a-token"})
    assert r.status_code == 401
    assert client.post("/api/v1/auth/logout", headers=viewer_headers).status_code == 204
    r = client.get(f"{SYSTEM_PREFIX}/workers", headers=viewer_headers)
    assert r.status_code == 401


def test_viewer_gets_403_on_every_operate_route_and_reads_the_rest(client, app, viewer_headers):
    for method, path in system_calls(app):
        r = _send(client, method, path, headers=viewer_headers)
        if method in SAFE_METHODS:
            assert r.status_code not in (401, 403), (method, path, r.text)
        else:
            assert r.status_code == 403, (method, path, r.status_code, r.text)
            assert r.json()["error"] == "forbidden"


def test_curator_cannot_operate_either(client, app, engine):
    add_user(engine, "curator@example.org", "CURATOR")
    csrf = cookie_login(client, "curator@example.org")
    for method, path in system_calls(app):
        if method not in SAFE_METHODS:
            r = _send(client, method, path, headers={"X-CSRF-Token": csrf})
            assert r.status_code == 403, (method, path)


def test_admin_passes_the_guard_everywhere(client, app, admin_headers):
    for method, path in system_calls(app):
        r = _send(client, method, path, headers=admin_headers)
        assert r.status_code not in (401, 403), (method, path, r.status_code, r.text)
        assert r.status_code < 500, (method, path, r.text)


def test_a_cookie_write_without_its_csrf_token_is_refused(client, app, engine):
    add_user(engine, "admin@example.org", "ADMIN")
    csrf = cookie_login(client, "admin@example.org")
    for method, path in system_calls(app):
        if method in SAFE_METHODS:
            continue
        r = _send(client, method, path)
        assert r.status_code == 403 and r.json()["error"] == "csrf_failed", (method, path, r.text)
        r = _send(client, method, path, headers={"X-CSRF-Token": "wrong" + csrf})
        assert r.status_code == 403 and r.json()["error"] == "csrf_failed", (method, path)
    # with the token the write goes through
    r = client.post(f"{SYSTEM_PREFIX}/workers/alpha/runs", json={}, headers={"X-CSRF-Token": csrf})
    assert r.status_code == 201, r.text
    # and logout (a cookie write too) needs it
    assert client.post("/api/v1/auth/logout").status_code == 403
    assert client.post("/api/v1/auth/logout", headers={"X-CSRF-Token": csrf}).status_code == 204


def test_a_forced_password_change_blocks_the_system_routes(client, app, engine):
    add_user(engine, "new@example.org", "ADMIN", must_change_password=True)
    csrf = cookie_login(client, "new@example.org")
    r = client.get(f"{SYSTEM_PREFIX}/workers")
    assert r.status_code == 403 and r.json()["error"] == "password_change_required"
    me = client.get("/api/v1/auth/me").json()
    assert me["must_change_password"] is True
    r = client.post("/api/v1/auth/change-password", headers={"X-CSRF-Token": csrf},
                    json={"current_password": "correct horse battery", "new_password": "short"})
    assert r.status_code == 422 and "new_password" in r.json()["fields"]
    r = client.post("/api/v1/auth/change-password", headers={"X-CSRF-Token": csrf},
                    json={"current_password": "correct horse battery", "new_password": "a much better passphrase"})
    assert r.status_code == 204, r.text
    assert client.get(f"{SYSTEM_PREFIX}/workers").status_code == 200


def test_an_unguarded_system_route_stops_the_app_from_starting(app):
    from fastapi import APIRouter

    router = APIRouter(prefix=SYSTEM_PREFIX)

    @router.get("/forgotten")
    def forgotten():
        return {}

    app.include_router(router)
    with pytest.raises(RuntimeError, match="not guarded"):
        assert_system_routes_guarded(app)
