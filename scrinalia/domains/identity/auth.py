"""The login: claim an attempt, check the password, answer alike for every e-mail; the password change.

Order of a login (docs/security.md, "Login and lockout"):

1. the attempt is claimed from its bucket (``lockout.claim``, one statement) BEFORE any password is
   checked: the account's bucket, or the device's own when the browser holds a device cookie of this
   account. A refused claim is ``AccountLocked`` at once, for a known and an unknown e-mail alike;
2. the password is checked against the user's hash, or against a dummy hash of the same cost when no
   user has the e-mail, so both take the same time and give the same answer;
3. a success deletes the bucket; a failure leaves the claim counted (nothing more to write).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from argon2 import PasswordHasher
from sqlalchemy import Engine, text

from scrinalia.domains.identity import devices, lockout
from scrinalia.domains.identity.errors import AccountLocked, InvalidCredentials, InvalidUserInput
from scrinalia.domains.identity.lockout import Bucket, LockoutPolicy
from scrinalia.domains.identity.passwords import (
    burn_verify_time,
    check_password_policy,
    hash_password,
    needs_rehash,
    verify_password,
)
from scrinalia.domains.identity.users import (
    USER_COLUMNS,
    User,
    _password_hash_for,
    _user,
    normalize_email,
    set_password,
)

__all__ = ["LockoutPolicy", "Login", "authenticate", "change_password"]

log = logging.getLogger("scrinalia.identity.auth")

_FIND_FOR_LOGIN = text(f"SELECT {USER_COLUMNS}, password_hash FROM auth_users WHERE lower(email) = :email")

_RECORD_SUCCESS = text("UPDATE auth_users SET last_login_at = now(), updated_at = now() WHERE id = :id")


@dataclass(frozen=True, slots=True)
class Login:
    user: User
    via_device: bool  # the attempt came through a device cookie of this user (its own bucket)


def authenticate(
    engine: Engine,
    email: str,
    password: str,
    *,
    device_token: str | None = None,
    policy: LockoutPolicy = LockoutPolicy(),
    hasher: PasswordHasher | None = None,
    pruner: lockout.Pruner | None = None,
) -> Login:
    """The user for these credentials. Raises ``InvalidCredentials`` or ``AccountLocked``."""
    try:
        clean = normalize_email(email)
    except InvalidUserInput:  # no account can have it: nothing to count, the same answer and time
        burn_verify_time(password, hasher)
        raise InvalidCredentials() from None
    device = devices.trusted_device(engine, device_token, clean)
    bucket = Bucket.device(device) if device else Bucket.account(clean)
    claim = lockout.claim(engine, bucket, policy)
    if pruner is not None:
        pruner.tick(engine, policy)
    if not claim.granted:
        raise AccountLocked(claim.locked_for or policy.base_seconds)
    row = _verified_user(engine, clean, password, hasher, bucket)
    if row is None:
        if claim.locked_for is not None:  # this claim reached the threshold: say so now
            raise AccountLocked(claim.locked_for)
        raise InvalidCredentials()
    _record_success(engine, bucket, row, password, hasher)
    return Login(_user(row), via_device=device is not None)


def _verified_user(engine: Engine, email: str, password: str, hasher: PasswordHasher | None,
                   bucket: Bucket) -> Any | None:
    """The user's row when the password is right and the account active, else None. A password check
    is spent whether or not the account exists (the same answer, the same time)."""
    with engine.connect() as conn:
        row = conn.execute(_FIND_FOR_LOGIN, {"email": email}).one_or_none()
    if row is None:
        burn_verify_time(password, hasher)
        ok = False
    else:
        ok = verify_password(row.password_hash, password, hasher)
    # The evidence that the lockout bounds the checks: one line per password checked, never the e-mail.
    log.info("login: password checked (%s bucket)", bucket.scope)
    return row if ok and row is not None and row.is_active else None


def _record_success(engine: Engine, bucket: Bucket, row: Any, password: str, hasher: PasswordHasher | None) -> None:
    """Release the bucket, stamp the login, and rehash the password if its parameters are outdated."""
    with engine.begin() as conn:
        lockout.release(conn, bucket)
        conn.execute(_RECORD_SUCCESS, {"id": row.id})
        if needs_rehash(row.password_hash, hasher):
            conn.execute(
                text("UPDATE auth_users SET password_hash = :h WHERE id = :id"),
                {"h": hash_password(password, hasher), "id": row.id},
            )


def change_password(
    engine: Engine,
    user: User,
    current_password: str,
    new_password: str,
    *,
    session_id: int | None,
    min_length: int = 12,
    hasher: PasswordHasher | None = None,
) -> None:
    """The user's own change: the current password must verify; other sessions are revoked."""
    current_hash = _password_hash_for(engine, user.id)
    if current_hash is None or not verify_password(current_hash, current_password, hasher):
        raise InvalidUserInput("current_password", "is not the current password")
    check_password_policy(new_password, min_length=min_length, email=user.email, field="new_password")
    if new_password == current_password:
        raise InvalidUserInput("new_password", "must differ from the current password")
    set_password(engine, user.id, new_password, keep_session_id=session_id, hasher=hasher)
