from __future__ import annotations

import hashlib

from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.api.conftest import PASSWORD, add_user, make_app


def test_login_sets_an_httponly_samesite_cookie_and_stores_only_the_token_digest(client, engine):
    add_user(engine, "Ada@Example.org", "VIEWER")
    r = client.post("/api/v1/auth/login", json={"email": "ada@example.org", "password": PASSWORD})
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"]
    assert "scrinalia_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Secure" not in cookie  # the tests turn it off; the default is on
    body = r.json()
    assert body["token"] is None and body["user"]["role"] == "VIEWER"
    assert "password_hash" not in r.text
    token = client.cookies.get("scrinalia_session")
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT token_sha256 FROM auth_sessions")).scalar_one()
        dump = conn.execute(text("SELECT row_to_json(s)::text FROM auth_sessions s")).scalar_one()
    assert stored == hashlib.sha256(token.encode()).hexdigest()
    assert token not in dump
    me = client.get("/api/v1/auth/me").json()
    assert me["user"]["email"] == "ada@example.org" and me["csrf_token"] == body["csrf_token"]


def test_the_secure_flag_is_on_by_default(engine):
    add_user(engine, "sec@example.org")
    app = make_app(engine, cookie_secure=True)
    with TestClient(app, base_url="https://testserver") as client:
        r = client.post("/api/v1/auth/login", json={"email": "sec@example.org", "password": PASSWORD})
        assert "Secure" in r.headers["set-cookie"]


def test_wrong_password_unknown_email_and_inactive_user_look_the_same(client, engine):
    add_user(engine, "a@example.org")
    add_user(engine, "gone@example.org")
    from scrinalia.domains.identity.users import deactivate

    deactivate(engine, "gone@example.org")
    answers = [
        client.post("/api/v1/auth/login", json={"email": "a@example.org", "password": "wrong password!"}),
        client.post("/api/v1/auth/login", json={"email": "nobody@example.org", "password": PASSWORD}),
        client.post("/api/v1/auth/login", json={"email": "gone@example.org", "password": PASSWORD}),
    ]
    assert {r.status_code for r in answers} == {401}
    assert len({r.json()["message"] for r in answers}) == 1


def test_lockout_after_five_failed_logins_and_its_window_doubles(client, engine):
    add_user(engine, "lock@example.org", "ADMIN")
    for i in range(4):
        r = client.post("/api/v1/auth/login", json={"email": "lock@example.org", "password": f"wrong {i} password"})
        assert r.status_code == 401
    r = client.post("/api/v1/auth/login", json={"email": "lock@example.org", "password": "wrong 5 password"})
    assert r.status_code == 423 and r.json()["error"] == "locked"
    first = int(r.headers["retry-after"])
    assert 55 <= first <= 60 and f"try again in {first} s" in r.json()["message"]
    # locked: even the right password is refused, and the lock is in the database (durable, every process)
    r = client.post("/api/v1/auth/login", json={"email": "lock@example.org", "password": PASSWORD})
    assert r.status_code == 423
    with engine.begin() as conn:
        row = conn.execute(text("SELECT scope, lockout_count, locked_until > now() AS locked "
                                "FROM auth_login_throttle")).one()
        assert row.scope == "account" and row.lockout_count == 1 and row.locked
        conn.execute(text("UPDATE auth_login_throttle SET locked_until = now() - interval '1 second'"))
    for i in range(5):
        r = client.post("/api/v1/auth/login", json={"email": "lock@example.org", "password": f"again {i} wrong"})
    assert r.status_code == 423
    second = int(r.headers["retry-after"])
    assert 115 <= second <= 120  # doubled
    with engine.begin() as conn:
        conn.execute(text("UPDATE auth_login_throttle SET locked_until = now() - interval '1 second'"))
    r = client.post("/api/v1/auth/login", json={"email": "lock@example.org", "password": PASSWORD})
    assert r.status_code == 200
    with engine.connect() as conn:  # a success ends the series and its doubling
        assert conn.execute(text("SELECT count(*) FROM auth_login_throttle")).scalar_one() == 0


def test_the_login_rate_limit_per_address(engine):
    add_user(engine, "rl@example.org")
    app = make_app(engine, login_rate_limit=3)
    with TestClient(app) as client:
        for _ in range(3):
            client.post("/api/v1/auth/login", json={"email": "rl@example.org", "password": "not it at all"})
        r = client.post("/api/v1/auth/login", json={"email": "rl@example.org", "password": PASSWORD})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


def test_logout_revokes_the_session(client, engine):
    add_user(engine, "out@example.org")
    r = client.post("/api/v1/auth/login", json={"email": "out@example.org", "password": PASSWORD})
    csrf = r.json()["csrf_token"]
    token = client.cookies.get("scrinalia_session")
    assert client.post("/api/v1/auth/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
    r = client.get("/api/v1/auth/me", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401


def test_a_bearer_token_for_scripts_sets_no_cookie(client, engine):
    add_user(engine, "bot@example.org", "ADMIN")
    r = client.post("/api/v1/auth/login", json={"email": "bot@example.org", "password": PASSWORD, "issue_token": True})
    assert r.status_code == 200 and r.json()["token"]
    assert "set-cookie" not in r.headers


def test_change_password_needs_the_current_one_and_revokes_other_sessions(client, engine):
    add_user(engine, "cp@example.org")
    other = client.post("/api/v1/auth/login", json={"email": "cp@example.org", "password": PASSWORD,
                                                     "issue_token": True}).json()["token"]
    login = client.post("/api/v1/auth/login", json={"email": "cp@example.org", "password": PASSWORD})
    csrf = login.json()["csrf_token"]
    r = client.post("/api/v1/auth/change-password", headers={"X-CSRF-Token": csrf},
                    json={"current_password": "not the password", "new_password": "a brand new passphrase"})
    assert r.status_code == 403 and r.json()["error"] == "wrong_current_password"
    assert "current_password" in r.json()["fields"]
    r = client.post("/api/v1/auth/change-password", headers={"X-CSRF-Token": csrf},
                    json={"current_password": PASSWORD, "new_password": "a brand new passphrase"})
    assert r.status_code == 204
    assert client.get("/api/v1/auth/me").status_code == 200  # this session survives
    assert client.get("/api/v1/auth/me", headers={"Authorization": f"Bearer {other}"}).status_code == 401
    r = client.post("/api/v1/auth/login", json={"email": "cp@example.org", "password": "a brand new passphrase"})
    assert r.status_code == 200


def test_healthz_needs_no_session_and_tells_no_secret(client, engine):
    r = client.get("/healthz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["database"] == "ok" and body["schema"] == "current"
    url = engine.url.render_as_string(hide_password=False)
    assert str(engine.url.port) not in r.text and url not in r.text
