"""GET /healthz (no session, no secrets) and GET /metrics (Prometheus text from the database: api.metrics).

/metrics names every runner and worker and the archive's size, so it is not anonymous: a scraper sends
``Authorization: Bearer <API_METRICS_TOKEN>`` (compared in constant time), or an ADMIN session reads it.
"""
from __future__ import annotations

import hmac
import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials

from scrinalia import __version__
from scrinalia.api import metrics as metrics_module
from scrinalia.api import views
from scrinalia.api.context import ctx
from scrinalia.api.errors import forbidden, not_found, unauthenticated
from scrinalia.api.schemas import ErrorOut, HealthOut
from scrinalia.api.security import OPERATE_ROLE, Principal, bearer_scheme, optional_principal
from scrinalia.db import migrate

log = logging.getLogger("scrinalia.api.health")
router = APIRouter(tags=["health"])


def health(request: Request) -> JSONResponse:
    version = __version__
    notifications = ctx(request).events.notifications()
    try:
        _, revision = views.db_clock(ctx(request).engine)
    except Exception as exc:  # the class only: a driver message may name the host
        log.warning("healthz: database unreachable (%s)", type(exc).__name__)
        body = {"status": "degraded", "database": "unreachable", "schema": "unknown", "version": version,
                "notifications": notifications}
        return JSONResponse(body, status_code=503)
    try:
        schema = _schema(request, revision)
    except Exception:  # the migrations cannot be read: the database's revision is unknown
        schema = "ahead_or_unknown"
    # A schema ahead that declares this release compatible is served (decision 0392): through the next
    # upgrade's window a load balancer keeps this API, and a rolled-back API is taken back.
    status = "ok" if schema in ("current", "ahead_compatible") else "degraded"
    body = {"status": status, "database": "ok", "schema": schema, "version": version, "notifications": notifications}
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


def _schema(request: Request, revision: str | None) -> str:
    """Where the database's revision stands for this API, in ``migrate``'s words; a schema ahead is read
    with its declaration (decision 0392), on a connection of its own: only when not at the head."""
    if revision == migrate.head_revision():
        return "current"
    with ctx(request).engine.connect() as conn:
        state = migrate.declared_state(conn, revision)
    return "ahead_or_unknown" if state == "ahead" else state


router.add_api_route("/healthz", health, methods=["GET"], response_model=HealthOut,
                     responses={503: {"model": HealthOut}}, summary="Liveness and readiness: database and schema")


def metrics_token_matches(expected: str | None, bearer: HTTPAuthorizationCredentials | None) -> bool:
    if not expected or bearer is None:
        return False
    return hmac.compare_digest(bearer.credentials.encode(), expected.encode())


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics (text format 0.0.4)",
            responses={200: {"content": {"text/plain": {}}}, 401: {"model": ErrorOut}, 403: {"model": ErrorOut},
                       404: {"model": ErrorOut}})
def metrics(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(bearer_scheme),
    principal: Principal | None = Depends(optional_principal),
) -> Any:
    """The scrape token of API_METRICS_TOKEN, or an ADMIN session. Judged as a whole: an Authorization
    header that is neither the scrape token nor a session's token is a 401, even beside a valid cookie
    (``optional_principal`` ignores the cookie whenever the header is present)."""
    c = ctx(request)
    if not c.api.metrics_enabled:
        raise not_found("metrics")
    expected = c.api.metrics_token.get_secret_value() if c.api.metrics_token is not None else None
    if not metrics_token_matches(expected, bearer):
        if principal is None:
            raise unauthenticated()
        if principal.user.role != OPERATE_ROLE or principal.user.must_change_password:
            raise forbidden("the metrics need the scrape token (API_METRICS_TOKEN) or an ADMIN session")
    registry = metrics_module.build_registry(c.engine, c.catalogue, c.counts)
    return Response(metrics_module.exposition(registry), media_type="text/plain; version=0.0.4; charset=utf-8")
