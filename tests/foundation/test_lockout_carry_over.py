"""The lockout is state that moves (migration 0005, decision 0125): the previous release's counters in
``auth_users`` are carried into ``auth_login_throttle`` at the upgrade, what that release writes after it
is carried by the trigger, and a downgrade carries the buckets' locks back. Each statement below is the
previous release's own (scrinalia/domains/identity/auth.py of PREVIOUS_RELEASE), run on a real database."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.identity.auth import authenticate
from scrinalia.domains.identity.errors import AccountLocked, InvalidCredentials
from scrinalia.domains.identity.lockout import LockoutPolicy
from scrinalia.domains.identity.passwords import cheap_hasher, hash_password

HASHER = cheap_hasher()
PASSWORD = "correct horse battery staple"
POLICY = LockoutPolicy(threshold=3, base_seconds=60)

# The previous release's failure and success, as it sends them.
OLD_FAILURE = text(
    """UPDATE auth_users SET
        failed_attempts = CASE WHEN failed_attempts + 1 >= :threshold THEN 0 ELSE failed_attempts + 1 END,
        lockout_count   = CASE WHEN failed_attempts + 1 >= :threshold THEN lockout_count + 1 ELSE lockout_count END,
        locked_until    = CASE WHEN failed_attempts + 1 >= :threshold
                               THEN now() + make_interval(secs => LEAST(CAST(:max_s AS double precision),
                                        :base_s * power(2, LEAST(lockout_count, 40))))
                               ELSE locked_until END,
        updated_at = now()
     WHERE lower(email) = :email"""
)
OLD_SUCCESS = text("""UPDATE auth_users SET failed_attempts = 0, lockout_count = 0, locked_until = NULL,
                      last_login_at = now(), updated_at = now() WHERE lower(email) = :email""")
BUCKET = text("""SELECT attempts, lockout_count, locked_until > now() AS locked FROM auth_login_throttle
                  WHERE scope = 'account'
                    AND key_sha256 = encode(sha256(convert_to(lower(:email), 'UTF8')), 'hex')""")


def _old_failures(conn, email: str, n: int) -> None:
    for _ in range(n):
        conn.execute(OLD_FAILURE, {"email": email, "threshold": POLICY.threshold, "base_s": 60.0, "max_s": 86400.0})


def _add_user(conn, email: str) -> None:
    conn.execute(text("INSERT INTO auth_users (email, password_hash, role) VALUES (:e, :h, 'VIEWER')"),
                 {"e": email, "h": hash_password(PASSWORD, HASHER)})


@pytest.fixture
def before_0005(empty_database_url):
    migrate.upgrade(empty_database_url, "0004")
    engine = create_engine_from_url(empty_database_url)
    yield empty_database_url, engine
    engine.dispose()


def test_the_upgrade_carries_locks_and_counts_and_the_trigger_carries_later_writes(before_0005):
    url, engine = before_0005
    with engine.begin() as conn:
        for email in ("locked@example.org", "counting@example.org", "clean@example.org", "later@example.org"):
            _add_user(conn, email)
        _old_failures(conn, "locked@example.org", POLICY.threshold)   # locked by the previous release
        _old_failures(conn, "counting@example.org", 2)                # two failures of a series
    migrate.upgrade(url)
    with engine.connect() as conn:
        locked = conn.execute(BUCKET, {"email": "locked@example.org"}).one()
        counting = conn.execute(BUCKET, {"email": "counting@example.org"}).one()
        assert conn.execute(BUCKET, {"email": "clean@example.org"}).one_or_none() is None
    assert locked.locked and locked.lockout_count == 1
    assert counting.attempts == 2 and not counting.locked
    with pytest.raises(AccountLocked):  # this release: the right password changes nothing while locked
        authenticate(engine, "locked@example.org", PASSWORD, policy=POLICY, hasher=HASHER)
    # The series goes on where the previous release left it: one more failure reaches the threshold.
    with pytest.raises(AccountLocked):
        authenticate(engine, "counting@example.org", "wrong password", policy=POLICY, hasher=HASHER)

    # After the upgrade the previous release still writes its columns: the trigger carries them.
    with engine.begin() as conn:
        _old_failures(conn, "later@example.org", POLICY.threshold)
    with pytest.raises(AccountLocked):
        authenticate(engine, "later@example.org", PASSWORD, policy=POLICY, hasher=HASHER)
    # Its successful login (or an administrator's reset) clears the columns, and so the bucket.
    with engine.begin() as conn:
        conn.execute(OLD_SUCCESS, {"email": "later@example.org"})
        assert conn.execute(BUCKET, {"email": "later@example.org"}).one_or_none() is None
    assert authenticate(engine, "later@example.org", PASSWORD, policy=POLICY, hasher=HASHER).user.email == \
        "later@example.org"


def test_a_lock_is_never_shortened_by_the_previous_release_writing_a_failure(before_0005):
    """This release locked the account; a failure the previous release records meanwhile keeps the lock."""
    url, engine = before_0005
    with engine.begin() as conn:
        _add_user(conn, "both@example.org")
    migrate.upgrade(url)
    for _ in range(POLICY.threshold):
        with pytest.raises((InvalidCredentials, AccountLocked)):
            authenticate(engine, "both@example.org", "wrong password", policy=POLICY, hasher=HASHER)
    with engine.begin() as conn:
        _old_failures(conn, "both@example.org", 1)
        assert conn.execute(BUCKET, {"email": "both@example.org"}).one().locked


def test_the_downgrade_carries_the_buckets_locks_back(before_0005):
    url, engine = before_0005
    with engine.begin() as conn:
        _add_user(conn, "back@example.org")
    migrate.upgrade(url)
    for _ in range(POLICY.threshold):
        with pytest.raises((InvalidCredentials, AccountLocked)):
            authenticate(engine, "back@example.org", "wrong password", policy=POLICY, hasher=HASHER)
    migrate.downgrade(url, "0004")
    with engine.connect() as conn:
        row = conn.execute(text("SELECT failed_attempts, lockout_count, locked_until > now() AS locked "
                                "FROM auth_users WHERE email = 'back@example.org'")).one()
    assert row.locked and row.lockout_count == 1 and row.failed_attempts == 0
