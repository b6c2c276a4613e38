"""The login: credentials, the durable lockout whose window doubles, and the password change.

Lockout: ``threshold`` consecutive failures lock the account for ``base x 2^lockout_count`` seconds
(capped), counted by ONE UPDATE so concurrent failures in several API processes count exactly. While an
account is locked its password is not even checked. A successful login clears both counters.
"""
from __future__ import annotations

from dataclasses import dataclass

from argon2 import PasswordHasher
from sqlalchemy import Engine, text

from scrinalia.domains.identity.errors import AccountLocked, InvalidCredentials, InvalidUserInput
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


@dataclass(frozen=True, slots=True)
class LockoutPolicy:
    threshold: int = 5
    base_seconds: float = 60.0
    max_seconds: float = 86_400.0


_FIND_FOR_LOGIN = text(
    f"""SELECT {USER_COLUMNS}, password_hash,
               CASE WHEN locked_until > now() THEN extract(epoch FROM locked_until - now()) END AS locked_for
          FROM auth_users WHERE lower(email) = :email"""
)

_RECORD_FAILURE = text(
    """
    UPDATE auth_users SET
        failed_attempts = CASE WHEN failed_attempts + 1 >= :threshold THEN 0 ELSE failed_attempts + 1 END,
        lockout_count   = CASE WHEN failed_attempts + 1 >= :threshold THEN lockout_count + 1 ELSE lockout_count END,
        locked_until    = CASE WHEN failed_attempts + 1 >= :threshold
                               THEN now() + make_interval(secs => LEAST(CAST(:max_s AS double precision),
                                        :base_s * power(2, LEAST(lockout_count, 40))))
                               ELSE locked_until END,
        updated_at = now()
     WHERE id = :id
    RETURNING CASE WHEN locked_until > now() THEN extract(epoch FROM locked_until - now()) END AS locked_for
    """
)

_RECORD_SUCCESS = text(
    """UPDATE auth_users SET failed_attempts = 0, lockout_count = 0, locked_until = NULL,
              last_login_at = now(), updated_at = now()
        WHERE id = :id"""
)


def authenticate(
    engine: Engine,
    email: str,
    password: str,
    *,
    policy: LockoutPolicy = LockoutPolicy(),
    hasher: PasswordHasher | None = None,
) -> User:
    """The user for these credentials. Raises ``InvalidCredentials`` or ``AccountLocked``."""
    try:
        clean = normalize_email(email)
    except InvalidUserInput:
        burn_verify_time(password if isinstance(password, str) else "")
        raise InvalidCredentials() from None
    with engine.connect() as conn:
        row = conn.execute(_FIND_FOR_LOGIN, {"email": clean}).one_or_none()
    if row is None:
        burn_verify_time(password)
        raise InvalidCredentials()
    if row.locked_for is not None:
        raise AccountLocked(float(row.locked_for))
    ok = verify_password(row.password_hash, password, hasher)
    if not row.is_active:
        raise InvalidCredentials()
    if not ok:
        with engine.begin() as conn:
            locked_for = conn.execute(
                _RECORD_FAILURE,
                {"id": row.id, "threshold": policy.threshold, "base_s": float(policy.base_seconds),
                 "max_s": float(policy.max_seconds)},
            ).scalar()
        if locked_for is not None:
            raise AccountLocked(float(locked_for))
        raise InvalidCredentials()
    with engine.begin() as conn:
        conn.execute(_RECORD_SUCCESS, {"id": row.id})
        if needs_rehash(row.password_hash, hasher):
            conn.execute(
                text("UPDATE auth_users SET password_hash = :h WHERE id = :id"),
                {"h": hash_password(password, hasher), "id": row.id},
            )
    return _user(row)


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
