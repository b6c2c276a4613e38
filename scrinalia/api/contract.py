"""The OpenAPI document tells the truth about the API it serves (docs/decisions/0320).

* ``MethodGate``: a request whose path is an API route's but whose method none of that path's routes
  takes is a 405 whose ``Allow`` lists exactly the methods of the path (the union over its routes), in
  the API's error shape. Without it Starlette answers with the first route that matched the path only,
  or, with the panel mounted at ``/``, with the static files' ``Allow: GET, HEAD``.
* ``document_every_answer``: every status code a route can answer is in its ``responses``; no route
  can forget one, because the rule is applied to the route table, not written on each route: 422 on
  every operation (``storable_inputs`` is app-wide), 401 and 403 on every operation that needs a session,
  404 on every operation with a path parameter (and under /system, where the guard's answers live).
* ``declare_configured_bounds``: bounds that come from the settings or the catalogue (the failures'
  ``days``, the password's length, the worker names) are written into the document of this process,
  so the schema states the bound the process enforces.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.routing import compile_path

from scrinalia.api.settings import ApiSettings
from scrinalia.domains.archive.workers.sdk import WorkerSpec

ERROR_REF = "#/components/schemas/ErrorOut"
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
_DESCRIPTIONS = {
    "401": "No valid session: no credential, an unknown or expired one, or an invalid Authorization header",
    "403": "The session may not do this: the ADMIN role, the CSRF token or a forced password change is missing",
    "404": "What the path names does not exist",
    "422": "The request breaks a rule of its schema or of the catalogue; fields names each offending field",
}


class MethodGate:
    """405 with an exact ``Allow`` for an API path asked with a method none of its routes takes."""

    def __init__(self, app, table: list[tuple[re.Pattern[str], frozenset[str]]]) -> None:
        self.app = app
        self.table = table

    def allowed(self, path: str) -> frozenset[str] | None:
        """The methods of every route whose path matches, or None when no API route has this path."""
        methods: set[str] = set()
        matched = False
        for regex, route_methods in self.table:
            if regex.match(path):
                matched = True
                methods |= route_methods
        return frozenset(methods) if matched else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            allowed = self.allowed(scope["path"])
            if allowed is not None and scope["method"] not in allowed:
                await _method_not_allowed(scope["method"], allowed, send)
                return
        await self.app(scope, receive, send)


async def _method_not_allowed(method: str, allowed: frozenset[str], send) -> None:
    import json

    allow = ", ".join(sorted(allowed))
    body = json.dumps({"error": "method_not_allowed",
                       "message": f"{method} is not a method of this path; it takes {allow}"}).encode()
    await send({"type": "http.response.start", "status": 405,
                "headers": [(b"content-type", b"application/json"), (b"allow", allow.encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def method_table(routes: Iterable[tuple[str, set[str]]]) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """(compiled path, methods) of each API route, for ``MethodGate``."""
    return [(compile_path(path)[0], frozenset(m.upper() for m in methods)) for path, methods in routes]


def document_every_answer(schema: dict[str, Any], system_prefix: str) -> dict[str, Any]:
    """Add to each operation the error answers its route can give (see the module's docstring)."""
    for path, item in schema.get("paths", {}).items():
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            codes = {"422"}
            if operation.get("security") or path.startswith(system_prefix):
                codes |= {"401", "403"}
            if "{" in path or path.startswith(system_prefix):
                codes.add("404")
            responses = operation.setdefault("responses", {})
            for code in sorted(codes):
                responses.setdefault(code, {"description": _DESCRIPTIONS[code],
                                            "content": {"application/json": {"schema": {"$ref": ERROR_REF}}}})
    return schema


def _parameter(schema: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any] | None:
    for parameter in schema.get("paths", {}).get(path, {}).get(method, {}).get("parameters", []):
        if parameter.get("name") == name:
            return parameter.setdefault("schema", {})
    return None


def declare_configured_bounds(schema: dict[str, Any], api: ApiSettings, catalogue: Mapping[str, WorkerSpec],
                              prefix: str) -> dict[str, Any]:
    """The bounds this process enforces that come from its settings and its catalogue. An engine or a
    preset is one of the catalogue's (the union over its workers: which worker takes which is in
    GET /system/workers, and a request naming another worker's engine is a 422 that says so)."""
    worker_names = list(catalogue)
    days = _parameter(schema, f"{prefix}/system/failures", "get", "days")
    if days is not None:
        days["maximum"] = api.failures_max_days
    components = schema.get("components", {}).get("schemas", {})
    new_password = components.get("ChangePasswordIn", {}).get("properties", {}).get("new_password")
    if new_password is not None:
        new_password["minLength"] = api.password_min_length
    worker_name = components.get("ScheduleIn", {}).get("properties", {}).get("worker_name")
    if worker_name is not None and worker_names:
        worker_name["enum"] = sorted(worker_names)
    engines = sorted({e for spec in catalogue.values() for e in spec.engines})
    presets = sorted({p for spec in catalogue.values() for e in spec.engines.values() for p in e.presets})
    for name in ("RunRequestIn", "SettingsIn"):
        properties = components.get(name, {}).get("properties", {})
        for field, values in (("engine_name", engines), ("preset", presets)):
            _declare_enum(properties.get(field), values)
    return schema


def _declare_enum(field: dict[str, Any] | None, values: list[str]) -> None:
    """``anyOf: [{string}, {null}]`` of an optional name: its string branch gets the enum."""
    if field is None or not values:  # no engine in the catalogue: the field is left as it is
        return
    for branch in field.get("anyOf", [field]):
        if branch.get("type") == "string":
            branch["enum"] = values


#: PostgreSQL stores no NUL in text or jsonb, so no string the API takes may hold one (``schemas.unstorable``).
NO_NUL = "^[^\\x00]*$"


def declare_storable_strings(schema: dict[str, Any]) -> dict[str, Any]:
    """Every string a request carries (parameters and the ``...In`` bodies) declares that it holds no NUL,
    unless an enum or a pattern of its own already says what it may be. A lone surrogate, the other
    unstorable string, cannot be stated in a JSON Schema; it is a 422 naming the field all the same."""
    for item in schema.get("paths", {}).values():
        for method in _METHODS:
            for parameter in item.get(method, {}).get("parameters", []):
                _no_nul(parameter.get("schema", {}))
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        if name.endswith("In"):
            _no_nul(component)
    return schema


def _no_nul(node: dict[str, Any]) -> None:
    if node.get("type") == "string" and "enum" not in node and "pattern" not in node and "format" not in node:
        node["pattern"] = NO_NUL
    for branch in node.get("anyOf", []):
        if "pattern" not in node:
            _no_nul(branch)
    for child in node.get("properties", {}).values():
        _no_nul(child)
    if isinstance(node.get("items"), dict):
        _no_nul(node["items"])


def honest_openapi(app: FastAPI, api: ApiSettings, catalogue: Mapping[str, WorkerSpec], prefix: str,
                   system_prefix: str) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` over FastAPI's own: the document built once, then completed by the rules above."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        document_every_answer(schema, system_prefix)
        declare_storable_strings(schema)
        declare_configured_bounds(schema, api, catalogue, prefix)
        app.openapi_schema = schema
        return schema

    return openapi
