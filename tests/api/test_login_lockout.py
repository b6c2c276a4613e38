"""The login's lockout (docs/security.md, "Login and lockout"): an attempt is claimed before its password
is checked, unknown and known e-mails are answered alike, and an attacker who does not know the password
cannot keep the user's own browser out (its device cookie has a bucket of its own).

The burst test runs against a real ``uvicorn --workers 2``: two processes, one database. Its evidence
that at most ``threshold`` passwords were checked is timing-independent: the "password checked" lines
of both processes' logs, and the answers (a checked wrong password is a 401, or the 423 of the claim
that reached the threshold; a refused claim is a 423 without any check)."""
from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.api.conftest import PASSWORD, add_user, make_app
from tests.api.live import live_api

LOGIN = "/api/v1/auth/login"
CHECKED = "login: password checked"


def _shape(r) -> tuple:
    """What an observer compares: status, code, the message with its number of seconds blanked, the
    header names; nothing that names the account."""
    body = r.json()
    return (r.status_code, body["error"], re.sub(r"\d+", "N", body["message"]),
            "retry-after" in r.headers)


def _wrong(client, email: str, n: int, **kw) -> list:
    return [client.post(LOGIN, json={"email": email, "password": f"wrong guess {i}!"}, **kw) for i in range(n)]


def _locked_in_db(engine, scope: str = "account") -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM auth_login_throttle WHERE scope = :s AND locked_until > now()"), {"s": scope}
        ).scalar_one())


def test_an_unknown_email_is_counted_locked_and_answered_like_a_known_one(engine, caplog):
    add_user(engine, "known@example.org", "ADMIN")
    app = make_app(engine)
    caplog.set_level(logging.INFO, logger="scrinalia.identity.auth")
    with TestClient(app) as client:
        known = _wrong(client, "known@example.org", 7)
        checked_known = caplog.text.count(CHECKED)
        caplog.clear()
        unknown = _wrong(client, "nobody@example.org", 7)
        checked_unknown = caplog.text.count(CHECKED)
    assert [_shape(r) for r in known] == [_shape(r) for r in unknown]
    assert [r.status_code for r in known] == [401] * 4 + [423] * 3
    assert [r.json() for r in known[:4]] == [r.json() for r in unknown[:4]]
    # The same work: one argon2 check per granted attempt (a dummy hash of the same cost for the
    # unknown address), none once locked; so the times do not tell them apart either.
    assert checked_known == checked_unknown == 5
    lock = unknown[-1]
    assert int(lock.headers["retry-after"]) >= 55
    assert f"try again in {lock.headers['retry-after']} s" in lock.json()["message"]


def test_the_users_own_browser_passes_the_lock_an_attacker_set(engine):
    add_user(engine, "admin@example.org", "ADMIN")
    app = make_app(engine)
    with TestClient(app) as browser, TestClient(app) as attacker, TestClient(app) as new_browser:
        r = browser.post(LOGIN, json={"email": "admin@example.org", "password": PASSWORD})
        assert r.status_code == 200
        assert "scrinalia_device=" in r.headers["set-cookie"]
        device_cookie = [c for c in r.headers.get_list("set-cookie") if c.startswith("scrinalia_device=")][0]
        assert "HttpOnly" in device_cookie and "Path=/api/v1/auth" in device_cookie
        assert "SameSite=strict" in device_cookie

        answers = _wrong(attacker, "admin@example.org", 10)
        assert answers[-1].status_code == 423 and _locked_in_db(engine)
        # Without the device cookie, the right password is refused while the account is locked.
        assert new_browser.post(LOGIN, json={"email": "admin@example.org", "password": PASSWORD}).status_code == 423
        # The browser that logged in before goes through, and is not handed a second device.
        r = browser.post(LOGIN, json={"email": "admin@example.org", "password": PASSWORD})
        assert r.status_code == 200, r.text
        assert "scrinalia_device=" not in r.headers.get("set-cookie", "")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM auth_devices")).scalar_one() == 1
        assert _locked_in_db(engine)  # its success does not lift the attacker's lock for the others

        # A stolen device cookie is no way around the lockout: the device has its own bucket.
        assert [r.status_code for r in _wrong(browser, "admin@example.org", 6)] == [401] * 4 + [423] * 2
        assert _locked_in_db(engine, "device")


def test_a_device_cookie_only_counts_for_its_own_account(engine):
    add_user(engine, "a@example.org")
    add_user(engine, "b@example.org")
    app = make_app(engine)
    with TestClient(app) as client:
        assert client.post(LOGIN, json={"email": "a@example.org", "password": PASSWORD}).status_code == 200
        # a's device cookie is sent with b's login: b's account bucket counts it
        assert [r.status_code for r in _wrong(client, "b@example.org", 5)][-1] == 423
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT scope FROM auth_login_throttle")).scalars().all()
        assert rows == ["account"]


def test_an_administrators_reset_lifts_the_lock_and_forgets_the_devices(engine):
    from scrinalia.domains.identity.users import reset_password
    from tests.api.conftest import HASHER

    add_user(engine, "r@example.org")
    app = make_app(engine)
    with TestClient(app) as client:
        assert client.post(LOGIN, json={"email": "r@example.org", "password": PASSWORD}).status_code == 200
        _wrong(TestClient(app), "r@example.org", 5)
        assert _locked_in_db(engine)
        reset_password(engine, "r@example.org", "a new long passphrase", hasher=HASHER)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM auth_devices")).scalar_one() == 0
            assert conn.execute(text("SELECT count(*) FROM auth_login_throttle")).scalar_one() == 0


def test_thirty_concurrent_wrong_logins_against_two_processes_check_at_most_five_passwords(
        database_url, engine):
    add_user(engine, "target@example.org", "ADMIN")
    with live_api(database_url, workers=2, API_TRUSTED_PROXIES="127.0.0.1",
                  API_LOGIN_RATE_LIMIT="10") as api:
        # The user's browser logged in before the attack: it holds a device cookie.
        with httpx.Client(base_url=api.base, timeout=30) as own_browser:
            login = own_browser.post(LOGIN, json={"email": "target@example.org", "password": PASSWORD})
            assert login.status_code == 200
            own_browser.cookies.delete("scrinalia_session")

            def attempt(args):
                i, email, password = args
                headers = {"X-Forwarded-For": f"203.0.113.{i}"}  # a distinct address per attempt
                with httpx.Client(base_url=api.base, timeout=60) as c:
                    return c.post(LOGIN, json={"email": email, "password": password}, headers=headers)

            for email in ("target@example.org", "ghost@example.org"):
                before = api.log().count(CHECKED)
                with ThreadPoolExecutor(max_workers=31) as pool:
                    burst = [pool.submit(attempt, (i, email, f"not the password {i}")) for i in range(30)]
                    deadline = time.monotonic() + 30
                    while not _locked_in_db(engine) and time.monotonic() < deadline:
                        time.sleep(0.01)
                    # the right password, sent while the burst has locked the account
                    right = pool.submit(attempt, (200, email, PASSWORD)).result()
                    answers = [f.result() for f in burst]
                checked = api.log().count(CHECKED) - before
                codes = sorted(a.status_code for a in answers)
                assert checked == 5, (email, checked, codes)
                assert codes == [401] * 4 + [423] * 26, (email, codes)
                assert right.status_code == 423, (email, right.text)
                first_401 = next(a for a in answers if a.status_code == 401)
                assert {_shape(a) for a in answers} == {_shape(first_401), _shape(right)}
                if email == "target@example.org":
                    known = sorted(_shape(a) for a in answers)
                    # the user's own browser still gets in, through its device's bucket
                    r = own_browser.post(LOGIN, json={"email": email, "password": PASSWORD})
                    assert r.status_code == 200, r.text
                else:
                    assert sorted(_shape(a) for a in answers) == known
                with engine.begin() as conn:  # the next burst starts from a clean account lock
                    conn.execute(text("DELETE FROM auth_login_throttle WHERE scope = 'account'"))


def test_idle_buckets_are_pruned_and_live_locks_kept(engine):
    from scrinalia.domains.identity.lockout import Bucket, LockoutPolicy, Pruner, claim

    policy = LockoutPolicy(threshold=1, base_seconds=60, max_seconds=60)
    claim(engine, Bucket.account("idle@example.org"), policy)
    claim(engine, Bucket.account("locked@example.org"), policy)
    with engine.begin() as conn:
        conn.execute(text("UPDATE auth_login_throttle SET updated_at = now() - interval '1 hour', "
                          "locked_until = CASE WHEN key_sha256 = :idle THEN now() - interval '1 minute' "
                          "ELSE now() + interval '1 minute' END"),
                     {"idle": Bucket.account("idle@example.org").key_sha256})
    Pruner(every=1).tick(engine, policy)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT key_sha256 FROM auth_login_throttle")).scalars().all()
    assert left == [Bucket.account("locked@example.org").key_sha256]
