"""Device cookies (OWASP, "Slow Down Online Guessing Attacks with Device Cookies").

A browser that logged in successfully gets a random device token (only its SHA-256 is stored, bound to
the user). Presented at a later login of the SAME account, it moves the attempt from the account's
bucket into the device's own bucket (``lockout``): an attacker who does not know the password can lock
the account for every other client, but not for the browsers its user already logged in from. A device
token is not a credential: the password is still checked, and the device's bucket locks like any other.
"""
from __future__ import annotations

from sqlalchemy import Connection, Engine, text

from scrinalia.domains.identity.tokens import new_token, token_digest

_TRUSTED = text(
    """SELECT d.token_sha256 FROM auth_devices d JOIN auth_users u ON u.id = d.user_id
        WHERE d.token_sha256 = :digest AND lower(u.email) = :email AND d.expires_at > now()"""
)

_ISSUE = text(
    """INSERT INTO auth_devices (token_sha256, user_id, expires_at)
       VALUES (:digest, :uid, now() + make_interval(days => :days))"""
)

_FORGET_EXPIRED = text("DELETE FROM auth_devices WHERE user_id = :uid AND expires_at <= now()")
_FORGET_ALL = text("DELETE FROM auth_devices WHERE user_id = :uid")


def trusted_device(engine: Engine, token: str | None, normalized_email: str) -> str | None:
    """The device's digest when ``token`` is a live device of the user with this e-mail, else None."""
    if not token or len(token) > 200:
        return None
    digest = token_digest(token)
    with engine.connect() as conn:
        return conn.execute(_TRUSTED, {"digest": digest, "email": normalized_email}).scalar()


def issue_device(conn: Connection, user_id: int, days: int) -> str:
    """A new device token for the browser that just logged in; give it to the client once."""
    token = new_token()
    conn.execute(_FORGET_EXPIRED, {"uid": user_id})
    conn.execute(_ISSUE, {"digest": token_digest(token), "uid": user_id, "days": int(days)})
    return token


def forget_devices(conn: Connection, user_id: int) -> None:
    """A password reset by an administrator: no browser keeps its way around the account's lock."""
    conn.execute(_FORGET_ALL, {"uid": user_id})
