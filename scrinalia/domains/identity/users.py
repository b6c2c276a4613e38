"""Users: create, find, list, change role, reset and change passwords, deactivate.

Emails are stored lower-cased and unique (``uq_auth_users_email`` on lower(email)). A ``User`` never
carries the password hash: only the login (``auth.authenticate``) and ``_password_hash_for`` (the
password change) read it.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from argon2 import PasswordHasher
from psycopg.errors import UniqueViolation
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from scrinalia.db.tables import USER_ROLES
from scrinalia.domains.identity.devices import forget_devices
from scrinalia.domains.identity.errors import InvalidUserInput, UserExists, UserNotFound
from scrinalia.domains.identity.lockout import clear_account
from scrinalia.domains.identity.passwords import check_password_policy, hash_password

EMAIL_MAX = 254
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")


@dataclass(frozen=True, slots=True)
class User:
    id: int
    email: str
    role: str
    is_active: bool
    must_change_password: bool
    locked_until: datetime | None  # the account's lock for clients without a device cookie (lockout)
    last_login_at: datetime | None
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, datetime):
                out[key] = value.isoformat()
        return out


def user_columns(table: str = "auth_users") -> str:
    """The select list of a ``User`` from ``table`` (a name or an alias of auth_users). ``locked_until``
    is the account bucket's lock (``lockout.Bucket.account``: the SHA-256 of the lower-cased e-mail),
    one primary-key probe."""
    plain = [f.name for f in fields(User) if f.name != "locked_until"]
    lock = (
        "(SELECT t.locked_until FROM auth_login_throttle t WHERE t.scope = 'account' "
        f"AND t.key_sha256 = encode(sha256(convert_to(lower({table}.email), 'UTF8')), 'hex') "
        "AND t.locked_until > now()) AS locked_until"
    )
    return ", ".join([f"{table}.{name}" for name in plain] + [lock])


USER_COLUMNS = user_columns()


def _user(row: Any) -> User:
    return User(**{f.name: row._mapping[f.name] for f in fields(User)})


def normalize_email(email: object) -> str:
    if not isinstance(email, str):
        raise InvalidUserInput("email", "must be a string")
    clean = email.strip().lower()
    if not clean or len(clean) > EMAIL_MAX or not _EMAIL.match(clean):
        raise InvalidUserInput("email", "must be an email address (name@host)")
    return clean


def normalize_role(role: object) -> str:
    if not isinstance(role, str) or role.upper() not in USER_ROLES:
        raise InvalidUserInput("role", f"must be one of {', '.join(USER_ROLES)}")
    return role.upper()


def create_user(
    engine: Engine,
    email: str,
    password: str,
    role: str = "VIEWER",
    *,
    must_change_password: bool = False,
    min_length: int = 12,
    hasher: PasswordHasher | None = None,
) -> User:
    clean = normalize_email(email)
    role = normalize_role(role)
    check_password_policy(password, min_length=min_length, email=clean)
    password_hash = hash_password(password, hasher)
    try:
        with engine.begin() as conn:
            row = conn.execute(
                text(
                    f"""INSERT INTO auth_users (email, password_hash, role, must_change_password)
                        VALUES (:email, :hash, CAST(:role AS user_role), :must)
                        RETURNING {USER_COLUMNS}"""
                ),
                {"email": clean, "hash": password_hash, "role": role, "must": must_change_password},
            ).one()
    except IntegrityError as exc:
        if isinstance(exc.orig, UniqueViolation):
            raise UserExists(clean) from None
        raise
    return _user(row)


def list_users(engine: Engine) -> list[User]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {USER_COLUMNS} FROM auth_users ORDER BY lower(email)")).all()
    return [_user(r) for r in rows]


def _update_one(conn: Connection, email: str, assignments: str, params: dict[str, Any]) -> User:
    row = conn.execute(
        text(
            f"UPDATE auth_users SET {assignments}, updated_at = now() "
            f"WHERE lower(email) = lower(:email) RETURNING {USER_COLUMNS}"
        ),
        {"email": email.strip(), **params},
    ).one_or_none()
    if row is None:
        raise UserNotFound(email)
    return _user(row)


def _revoke_sessions(conn: Connection, user_id: int, except_session_id: int | None = None) -> int:
    return conn.execute(
        text(
            "UPDATE auth_sessions SET revoked_at = now() WHERE user_id = :uid AND revoked_at IS NULL "
            "AND (CAST(:keep AS bigint) IS NULL OR id <> :keep)"
        ),
        {"uid": user_id, "keep": except_session_id},
    ).rowcount


def set_role(engine: Engine, email: str, role: str) -> User:
    role = normalize_role(role)
    with engine.begin() as conn:
        return _update_one(conn, email, "role = CAST(:role AS user_role)", {"role": role})


def reset_password(
    engine: Engine,
    email: str,
    new_password: str,
    *,
    must_change_password: bool = True,
    min_length: int = 12,
    hasher: PasswordHasher | None = None,
) -> User:
    """An administrator's reset: new hash, the account's lock lifted, every session and device forgotten."""
    check_password_policy(new_password, min_length=min_length, email=email)
    password_hash = hash_password(new_password, hasher)
    with engine.begin() as conn:
        user = _update_one(
            conn,
            email,
            "password_hash = :hash, must_change_password = :must",
            {"hash": password_hash, "must": must_change_password},
        )
        _revoke_sessions(conn, user.id)
        clear_account(conn, user.email)
        forget_devices(conn, user.id)
    return user


def deactivate(engine: Engine, email: str) -> User:
    with engine.begin() as conn:
        user = _update_one(conn, email, "is_active = false", {})
        _revoke_sessions(conn, user.id)
    return user


def activate(engine: Engine, email: str) -> User:
    with engine.begin() as conn:
        return _update_one(conn, email, "is_active = true", {})


def set_password(
    engine: Engine,
    user_id: int,
    new_password: str,
    *,
    keep_session_id: int | None = None,
    hasher: PasswordHasher | None = None,
) -> None:
    """The user's own change (policy checked by the caller): clears the forced change and revokes the
    user's other sessions, keeping the one that made the change."""
    password_hash = hash_password(new_password, hasher)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE auth_users SET password_hash = :hash, must_change_password = false, "
                "updated_at = now() WHERE id = :id"
            ),
            {"hash": password_hash, "id": user_id},
        )
        _revoke_sessions(conn, user_id, keep_session_id)


def _password_hash_for(engine: Engine, user_id: int) -> str | None:
    """The stored hash, for ``auth.change_password`` to check the current password."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT password_hash FROM auth_users WHERE id = :id"), {"id": user_id}).scalar()
