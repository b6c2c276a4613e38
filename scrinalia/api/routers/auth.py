"""/api/v1/auth: login, logout, me, change-password."""
from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Cookie, Depends, Request, Response

from scrinalia.api.context import ctx
from scrinalia.api.errors import ApiError, field_errors
from scrinalia.api.schemas import ChangePasswordIn, ErrorOut, LoginIn, SessionOut
from scrinalia.api.security import COOKIE_NAME, Principal, session_principal
from scrinalia.domains.identity import auth as identity_auth
from scrinalia.domains.identity.devices import issue_device
from scrinalia.domains.identity.errors import AccountLocked, InvalidCredentials, InvalidUserInput
from scrinalia.domains.identity.sessions import create_session, revoke_session

log = logging.getLogger("scrinalia.api.auth")
router = APIRouter(prefix="/auth", tags=["auth"])

DEVICE_COOKIE = "scrinalia_device"
DEVICE_COOKIE_PATH = "/api/v1/auth"  # only the login needs it: no other request carries it


def client_address(request: Request) -> str:
    # The TCP peer, or the forwarded client when the peer is in API_TRUSTED_PROXIES (api.middleware).
    return request.client.host if request.client else "unknown"


def locked(seconds: int) -> ApiError:
    """The same answer for every locked bucket, known e-mail or not; the wait in the header and the text."""
    return ApiError(
        423, "locked",
        f"too many failed logins for this account; try again in {seconds} s "
        "(a browser that has logged in to this account before is not held by this lock)",
        headers={"Retry-After": str(seconds)}, retry_after=seconds,
    )


def _user_out(user) -> dict[str, Any]:
    data = user.to_json()
    keys = ("id", "email", "role", "is_active", "must_change_password", "last_login_at", "created_at")
    return {k: data[k] for k in keys}


def _session_out(user, csrf_token: str, expires_at, token: str | None = None) -> dict[str, Any]:
    """The answer of the login and of /auth/me (``SessionOut``)."""
    return {
        "user": _user_out(user),
        "csrf_token": csrf_token,
        "expires_at": expires_at.isoformat(),
        "must_change_password": user.must_change_password,
        "token": token,
    }


@router.post(
    "/login",
    response_model=SessionOut,
    responses={401: {"model": ErrorOut}, 423: {"model": ErrorOut}, 429: {"model": ErrorOut}},
    summary="Open a session (sets the HttpOnly cookie, or answers a bearer token with issue_token)",
)
def login(body: LoginIn, request: Request, response: Response,
          device: str | None = Cookie(default=None, alias=DEVICE_COOKIE, include_in_schema=False)) -> dict[str, Any]:
    c = ctx(request)
    address = client_address(request)
    wait = c.login_limiter.hit(address)
    if wait:
        raise ApiError(429, "rate_limited", "too many login attempts from this address; try again later",
                       headers={"Retry-After": str(int(wait) + 1)}, retry_after=int(wait) + 1)
    try:
        result = identity_auth.authenticate(c.engine, body.email, body.password, device_token=device,
                                            policy=c.lockout, hasher=c.hasher, pruner=c.lockout_pruner)
    except AccountLocked as exc:
        log.warning("login refused: locked (address %s)", address)
        raise locked(exc.retry_after_seconds) from None
    except InvalidCredentials as exc:
        log.info("login failed (address %s)", address)
        raise ApiError(401, "invalid_credentials", str(exc)) from None
    user = result.user
    session = create_session(
        c.engine, user.id, hours=c.api.session_hours, client_address=address,
        user_agent=request.headers.get("user-agent"),
    )
    log.info("login: user %s (address %s%s)", user.id, address, ", known device" if result.via_device else "")
    out = _session_out(user, session.csrf_token, session.expires_at, session.token if body.issue_token else None)
    if not body.issue_token:
        response.set_cookie(
            COOKIE_NAME, session.token, max_age=int(c.api.session_hours * 3600), path="/",
            secure=c.api.cookie_secure, httponly=True, samesite=c.api.cookie_samesite,
        )
        if not result.via_device:
            with c.engine.begin() as conn:
                device_token = issue_device(conn, user.id, c.api.device_cookie_days)
            response.set_cookie(
                DEVICE_COOKIE, device_token, max_age=c.api.device_cookie_days * 86_400, path=DEVICE_COOKIE_PATH,
                secure=c.api.cookie_secure, httponly=True, samesite="strict",
            )
    response.headers["Cache-Control"] = "no-store"
    return out


@router.post("/logout", status_code=204, responses={401: {"model": ErrorOut}, 403: {"model": ErrorOut}},
             summary="Revoke this session and clear the cookie")
def logout(request: Request, principal: Principal = Depends(session_principal)) -> Response:
    c = ctx(request)
    revoke_session(c.engine, principal.session.session_id)
    response = Response(status_code=204)
    response.delete_cookie(COOKIE_NAME, path="/", secure=c.api.cookie_secure, httponly=True,
                           samesite=c.api.cookie_samesite)
    return response


@router.get("/me", response_model=SessionOut, responses={401: {"model": ErrorOut}},
            summary="The session's user, its CSRF token and expiry")
def me(response: Response, principal: Principal = Depends(session_principal)) -> dict[str, Any]:
    response.headers["Cache-Control"] = "no-store"
    return _session_out(principal.user, principal.session.csrf_token, principal.session.expires_at)


@router.post("/change-password", status_code=204,
             responses={401: {"model": ErrorOut},
                        403: {"model": ErrorOut, "description": "The current password is wrong "
                                                                "(wrong_current_password, with fields), or CSRF"},
                        422: {"model": ErrorOut}},
             summary="Change one's own password (also the forced change); revokes the user's other sessions")
def change_password(body: ChangePasswordIn, request: Request,
                    principal: Principal = Depends(session_principal)) -> Response:
    c = ctx(request)
    try:
        identity_auth.change_password(
            c.engine, principal.user, body.current_password, body.new_password,
            session_id=principal.session.session_id, min_length=c.api.password_min_length, hasher=c.hasher,
        )
    except InvalidUserInput as exc:
        if exc.field == "current_password":  # a well-formed request the account refuses: not a 422
            raise ApiError(403, "wrong_current_password", f"{exc.field}: {exc.message}",
                           fields={exc.field: exc.message}) from None
        raise field_errors({exc.field: exc.message}) from None
    log.info("password changed: user %s", principal.user.id)
    return Response(status_code=204)
