"""The FastAPI application factory.

    uvicorn --factory scrinalia.api.app:create_app --workers 4      (or: scrinalia api --workers 4)

Stateless across processes: sessions, lockouts, the queue and the settings live in PostgreSQL; the only
per-process state is the login rate limiter (a brake: decision 0032) and the connection pool.
Every answer carries the security headers; forwarded headers count only from API_TRUSTED_PROXIES
(``scrinalia.api.middleware``, docs/security.md).
The API never runs a worker and never imports ``runner``, torch or transformers.
"""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from fastapi import APIRouter, Depends, FastAPI
from fastapi.routing import APIRoute
from sqlalchemy import Engine

from scrinalia import bundled
from scrinalia.api import catalogue_view, contract, errors
from scrinalia.api.context import AppContext
from scrinalia.api.middleware import BoundedJsonBodies, SecurityHeaders, trusted_proxies
from scrinalia.api.routers import auth, charts, events, health, runners, runs, schedules, workers
from scrinalia.api.schemas import storable_inputs
from scrinalia.api.security import system_guard
from scrinalia.api.settings import ApiSettings, load_api_settings
from scrinalia.domains.archive.workers.sdk import WorkerSpec
from scrinalia.settings import Settings, get_settings

API_PREFIX = "/api/v1"
SYSTEM_PREFIX = f"{API_PREFIX}/system"

log = logging.getLogger("scrinalia.api")


def system_router() -> APIRouter:
    """Every /system route hangs under this router, whose dependency is the guard: none can forget it."""
    router = APIRouter(prefix="/system", dependencies=[Depends(system_guard)])
    router.include_router(workers.router)
    router.include_router(runs.router)
    router.include_router(runners.router)
    router.include_router(schedules.router)
    router.include_router(events.router)
    router.include_router(charts.router)
    return router


def create_app(
    settings: Settings | None = None,
    engine: Engine | None = None,
    *,
    api_settings: ApiSettings | None = None,
    catalogue: dict[str, WorkerSpec] | None = None,
    hasher: PasswordHasher | None = None,
    ui_dir: Path | str | None = None,
) -> FastAPI:
    api = api_settings or load_api_settings()
    owns_engine = engine is None
    if engine is None:
        from scrinalia.db.engine import app_engine

        settings = settings or get_settings()
        engine = app_engine(settings)
    if catalogue is None:
        catalogue = catalogue_view.load()
    context = AppContext(engine=engine, settings=settings, api=api, catalogue=catalogue, hasher=hasher,
                         owns_engine=owns_engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        context.events.install_shutdown_hook()  # open event streams must not hold up a shutdown
        yield
        await context.events.close()
        await context.stream_sessions.close()
        if context.owns_engine:
            context.engine.dispose()

    app = FastAPI(
        title="Scrinalia API",
        version=_version(),
        description=(
            "Enqueue, cancel and inspect the AI workers of the archive. Every /system route needs a session "
            "(cookie from POST /api/v1/auth/login, or a Bearer token); writes are ADMIN only and, with the "
            "cookie, need the X-CSRF-Token header. Errors: {\"error\": code, \"message\": ..., \"fields\"?: {...}}."
        ),
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # no interactive docs: swagger-ui would come from a CDN (docs/decisions/0058)
        redoc_url=None,
        lifespan=lifespan,
        dependencies=[Depends(storable_inputs)],
    )
    app.state.ctx = context
    errors.install(app)
    _wrap_every_answer(app, api.proxy_networks)

    app.include_router(health.router)  # /healthz (no session), /metrics (scrape token or ADMIN session)
    v1 = APIRouter(prefix=API_PREFIX)
    v1.include_router(auth.router)
    v1.include_router(system_router())
    v1.add_api_route("/healthz", health.health, methods=["GET"], include_in_schema=False)
    app.include_router(v1)
    assert_system_routes_guarded(app)
    app.openapi = contract.honest_openapi(app, api, catalogue, API_PREFIX,  # type: ignore[method-assign]
                                          SYSTEM_PREFIX)

    # The panel's static files, registered last so every API route wins over a file of the same path.
    directory = Path(ui_dir or api.ui_dir or bundled.ui_dir())
    if directory.is_dir():
        from fastapi.staticfiles import StaticFiles

        app.mount("/", StaticFiles(directory=directory, html=True), name="ui")
    return app


def _wrap_every_answer(app: FastAPI, proxy_networks: list[str]) -> None:
    """The forwarded-header rewrite (trusted proxies only), the security headers, the bounded JSON
    bodies and the 405 of an API path asked with a method it does not take (``contract.MethodGate``)
    around Starlette's whole stack, its own 500 answer included (``add_middleware`` would sit inside
    that one). The route table is read when the stack is built: after every route is added."""
    build = app.build_middleware_stack

    def build_wrapped():
        table = contract.method_table((path, methods) for path, methods, _ in api_routes(app))
        table += contract.method_table([(app.openapi_url or "", {"GET", "HEAD"})])
        gate = contract.MethodGate(build(), table)
        return trusted_proxies(SecurityHeaders(BoundedJsonBodies(gate)), proxy_networks)

    app.build_middleware_stack = build_wrapped  # type: ignore[method-assign]  # wraps Starlette's own stack


def api_routes(app: FastAPI) -> list[tuple[str, set[str], object]]:
    """(path, methods, dependant) of every API route, whatever way FastAPI nests included routers."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # older FastAPI: included routes are flattened into app.routes
        contexts: list[Any] = [r for r in app.routes if isinstance(r, APIRoute)]
    else:
        contexts = [c for c in iter_route_contexts(app.routes) if isinstance(c.original_route, APIRoute)]
    return [(c.path, set(c.methods or ()), c.dependant) for c in contexts]


def _calls(dependant) -> set:
    out = set()
    for dep in getattr(dependant, "dependencies", ()) or ():
        out.add(dep.call)
    return out


def assert_system_routes_guarded(app: FastAPI) -> None:
    """Refuse to start if a route under /api/v1/system does not carry ``system_guard``."""
    routes = api_routes(app)
    if not any(path.startswith(SYSTEM_PREFIX) for path, _, _ in routes):
        raise RuntimeError("no /system route found: the guard check cannot see the route table")
    for path, _, dependant in routes:
        if path.startswith(SYSTEM_PREFIX) and system_guard not in _calls(dependant):
            raise RuntimeError(f"route {path} is not guarded by system_guard")


def _version() -> str:
    from scrinalia import __version__

    return __version__
