"""Authentication and authorisation as FastAPI dependencies.

* A session comes from the ``scrinalia_session`` cookie (the panel) or an ``Authorization: Bearer``
  header (scripts). Only the token's SHA-256 is stored; the token is looked up on every request.
* ``system_guard`` is installed on the /system router itself, so no route under it can forget it:
  every request needs a session whose password need not be changed first; a request with an unsafe
  method (POST, PUT, PATCH, DELETE) is OPERATE and needs the ADMIN role, and, when it is made with the
  cookie, the session's CSRF token in ``X-CSRF-Token``. A bearer header is not sent by a browser on its
  own, so it needs no CSRF token.
* Credentials are judged as a whole: a request that carries an ``Authorization`` header is judged by it
  alone. An invalid or malformed one (an unknown token, ``Basic ...``, ``Bearer`` with nothing after it)
  is refused with 401 even when a valid session cookie travels beside it: the cookie never rescues a
  credential the caller chose to send (docs/decisions/0320).
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, forbidden, unauthenticated
from scrinalia.domains.identity.sessions import SessionInfo, resolve_session

COOKIE_NAME = "scrinalia_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPERATE_ROLE = "ADMIN"

cookie_scheme = APIKeyCookie(name=COOKIE_NAME, auto_error=False, scheme_name="sessionCookie",
                             description="Set by POST /api/v1/auth/login (HttpOnly, SameSite)")
bearer_scheme = HTTPBearer(auto_error=False, scheme_name="sessionBearer",
                           description="The token of POST /api/v1/auth/login with issue_token=true")
csrf_scheme = APIKeyHeader(name=CSRF_HEADER, auto_error=False, scheme_name="csrfToken",
                           description="Required with the cookie on every write: the csrf_token of the login "
                                       "or of /auth/me")


@dataclass(frozen=True, slots=True)
class Principal:
    session: SessionInfo
    via: str  # "cookie" | "bearer"

    @property
    def user(self):
        return self.session.user

    @property
    def label(self) -> str:
        return self.session.user.email

    @property
    def trigger(self) -> str:
        """The ledger's trigger of a run this principal enqueues: PANEL for the browser's cookie session
        (the panel is what logs in with the cookie), API for a bearer token (a script). Decision 0323."""
        return "PANEL" if self.via == "cookie" else "API"


def optional_principal(
    request: Request,
    cookie: str | None = Depends(cookie_scheme),
    bearer: HTTPAuthorizationCredentials | None = Depends(bearer_scheme),
) -> Principal | None:
    # Resolved once per request: FastAPI caches a dependency's value for the whole request, also when
    # both the /system router and the route itself depend on ``system_guard``.
    token: str | None
    if request.headers.get("authorization") is not None:
        if bearer is None:  # present but not "Bearer <token>": refused, whatever cookie is beside it
            return None
        token, via = bearer.credentials, "bearer"
    else:
        token, via = cookie, "cookie"
    if not token:
        return None
    info = resolve_session(ctx(request).engine, token)
    if info is None:
        return None
    return Principal(info, via)


def check_csrf(request: Request, principal: Principal, header: str | None) -> None:
    if request.method in SAFE_METHODS or principal.via != "cookie":
        return
    if not header or not hmac.compare_digest(header.encode(), principal.session.csrf_token.encode()):
        raise forbidden(f"a write made with the session cookie needs the {CSRF_HEADER} header", "csrf_failed")


def session_principal(
    request: Request,
    principal: Principal | None = Depends(optional_principal),
    csrf: str | None = Depends(csrf_scheme),
) -> Principal:
    """Any live session (also one that must change its password): for /auth/me, logout, change-password."""
    if principal is None:
        raise unauthenticated()
    check_csrf(request, principal, csrf)
    return principal


def system_guard(request: Request, principal: Principal = Depends(session_principal)) -> Principal:
    """The guard of every /system route (installed on the router): a live session with its CSRF
    token for cookie writes, a password already changed, and the ADMIN role to operate."""
    if principal.user.must_change_password:
        raise ApiError(403, "password_change_required",
                       "the password must be changed first (POST /api/v1/auth/change-password)")
    if request.method not in SAFE_METHODS and principal.user.role != OPERATE_ROLE:
        raise forbidden(f"{request.method} {request.url.path} operates the system and needs the ADMIN role")
    return principal

