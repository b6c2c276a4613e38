from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from scrinalia.api.app import create_app
from scrinalia.api.settings import ApiSettings
from scrinalia.domains.identity.passwords import cheap_hasher
from scrinalia.domains.identity.users import create_user
from tests.api.workers_fixture import WORKERS

PASSWORD = "correct horse battery"
HASHER = cheap_hasher()


def api_settings(**overrides) -> ApiSettings:
    # events_stream_seconds=0: the live-panel stream answers its hello and ends (the route-table walks
    # of test_guards call every GET; a stream that never ends would hold them forever).
    base: dict[str, Any] = dict(cookie_secure=False, login_rate_limit=1000, lockout_base_seconds=60,
                                counts_max_age_seconds=0, events_stream_seconds=0)
    base.update(overrides)
    return ApiSettings(**base)


def make_app(engine: Engine, **settings):
    return create_app(engine=engine, api_settings=api_settings(**settings),
                      catalogue={w.name: w for w in WORKERS}, hasher=HASHER, ui_dir="/nonexistent")


@pytest.fixture
def app(engine: Engine):
    return make_app(engine)


@pytest.fixture
def client(app) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def add_user(engine: Engine, email: str, role: str = "VIEWER", **kw):
    return create_user(engine, email, PASSWORD, role, hasher=HASHER, **kw)


def bearer(client: TestClient, email: str, password: str = PASSWORD) -> dict[str, str]:
    r = client.post("/api/v1/auth/login", json={"email": email, "password": password, "issue_token": True})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def cookie_login(client: TestClient, email: str, password: str = PASSWORD) -> str:
    """Log the client in with the cookie; returns the CSRF token."""
    r = client.post("/api/v1/auth/login", json={"email": email, "password": password})
    assert r.status_code == 200, r.text
    return r.json()["csrf_token"]


@pytest.fixture
def admin_headers(engine, client) -> dict[str, str]:
    add_user(engine, "admin@example.org", "ADMIN")
    return bearer(client, "admin@example.org")


@pytest.fixture
def viewer_headers(engine, client) -> dict[str, str]:
    add_user(engine, "viewer@example.org", "VIEWER")
    return bearer(client, "viewer@example.org")
