"""One error shape for every answer that is not a success.

    {"error": "<code>", "message": "<one sentence>", ...extra}

``fields`` (422) maps each offending field to its message; ``active_run`` (409 on enqueue) is the run
that holds the worker's slot; ``run`` (409 on cancel) is the run that has already ended. Messages never
contain a password, a token, a hash or a database URL.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("scrinalia.api")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    422: "validation_failed",
    423: "locked",
    429: "rate_limited",
}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": self.code, "message": self.message, **self.extra}, status_code=self.status, headers=self.headers
        )


def unauthenticated() -> ApiError:
    return ApiError(401, "unauthenticated", "a valid session is required", headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str = "this needs the ADMIN role", code: str = "forbidden") -> ApiError:
    return ApiError(403, code, message)


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


def field_errors(fields: dict[str, str], message: str | None = None) -> ApiError:
    first = next(iter(fields.items()))
    return ApiError(422, "validation_failed", message or f"{first[0]}: {first[1]}", fields=fields)


def _loc_to_field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields: dict[str, str] = {}
        for err in exc.errors():
            message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            fields.setdefault(_loc_to_field(tuple(err.get("loc", ()))), message)
        return field_errors(fields or {"body": "invalid request"}).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        return JSONResponse({"error": code, "message": message}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The exception's class only: its message could quote a parameter.
        log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal", "message": "internal error"}, status_code=500)
