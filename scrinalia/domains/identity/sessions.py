"""Sessions: a random token in the client's cookie (or bearer header); only its SHA-256 is stored.

The CSRF token is a second random value bound to the session: the panel reads it from the login (or
``/auth/me``) answer and sends it in ``X-CSRF-Token`` with every write made with the cookie.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

from scrinalia.db.engine import one_statement
from scrinalia.domains.identity.tokens import new_token, token_digest
from scrinalia.domains.identity.users import User, _user, user_columns

TOUCH_EVERY_SECONDS = 60


@dataclass(frozen=True, slots=True)
class NewSession:
    session_id: int
    token: str  # give it to the client once; never store or log it
    csrf_token: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: int
    user: User
    csrf_token: str
    expires_at: datetime


def create_session(
    engine: Engine,
    user_id: int,
    *,
    hours: float,
    client_address: str | None = None,
    user_agent: str | None = None,
) -> NewSession:
    token = new_token()
    csrf = new_token()
    with engine.begin() as conn:
        row = conn.execute(
            text(
                """INSERT INTO auth_sessions (token_sha256, csrf_token, user_id, expires_at, last_seen_at,
                                              client_address, user_agent)
                   VALUES (:digest, :csrf, :uid, now() + make_interval(secs => :secs), now(), :addr, :ua)
                   RETURNING id, expires_at"""
            ),
            {
                "digest": token_digest(token),
                "csrf": csrf,
                "uid": user_id,
                "secs": float(hours) * 3600.0,
                "addr": (client_address or "")[:100] or None,
                "ua": (user_agent or "")[:300] or None,
            },
        ).one()
        # Housekeeping on the user's own index: sessions long expired or revoked go away.
        conn.execute(
            text(
                "DELETE FROM auth_sessions WHERE user_id = :uid AND "
                "(expires_at < now() - interval '7 days' OR revoked_at < now() - interval '7 days')"
            ),
            {"uid": user_id},
        )
    return NewSession(row.id, token, csrf, row.expires_at)


_RESOLVE = text(
    f"""
    SELECT s.id AS session_id, s.csrf_token, s.expires_at,
           s.last_seen_at < now() - make_interval(secs => {TOUCH_EVERY_SECONDS}) AS stale_seen,
           {user_columns("u")}
      FROM auth_sessions s JOIN auth_users u ON u.id = s.user_id
     WHERE s.token_sha256 = :digest AND s.revoked_at IS NULL AND s.expires_at > now() AND u.is_active
    """
)


def resolve_session(engine: Engine, token: str) -> SessionInfo | None:
    """The live session for ``token`` (not revoked, not expired, user active), or None."""
    if not token or len(token) > 200:
        return None
    digest = token_digest(token)
    # autocommit: the lookup (on every authenticated request) and the occasional touch are one statement
    # each, without a BEGIN/ROLLBACK pair around them (two round trips fewer per request)
    with one_statement(engine) as conn:
        row = conn.execute(_RESOLVE, {"digest": digest}).one_or_none()
        if row is None:
            return None
        if row.stale_seen:
            conn.execute(text("UPDATE auth_sessions SET last_seen_at = now() WHERE id = :id"), {"id": row.session_id})
    return SessionInfo(row.session_id, _user(row), row.csrf_token, row.expires_at)


def revoke_session(engine: Engine, session_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE auth_sessions SET revoked_at = now() WHERE id = :id AND revoked_at IS NULL"),
            {"id": session_id},
        )


@dataclass(frozen=True, slots=True)
class SessionStanding:
    """What a long-lived answer (an event stream) was opened under, compared again while it lasts."""

    role: str
    must_change_password: bool


_STANDING = text(
    """
    SELECT s.id AS session_id, u.role, u.must_change_password
      FROM auth_sessions s JOIN auth_users u ON u.id = s.user_id
     WHERE s.id = ANY(:ids) AND s.revoked_at IS NULL AND s.expires_at > now() AND u.is_active
    """
)


def live_standings(engine: Engine, session_ids: list[int]) -> dict[int, SessionStanding]:
    """Of ``session_ids``, the sessions still live (not revoked, not expired, user active) and their
    user's role now: ONE statement for every open stream of the process (decision 0141)."""
    if not session_ids:
        return {}
    with one_statement(engine) as conn:
        rows = conn.execute(_STANDING, {"ids": sorted(set(session_ids))}).all()
    return {row.session_id: SessionStanding(row.role, bool(row.must_change_password)) for row in rows}
