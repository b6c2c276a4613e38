"""ASGI middleware of every answer: the reverse proxies the operator trusts, and the security headers.

* Forwarded headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) are believed only when the TCP peer
  is in ``API_TRUSTED_PROXIES`` (none by default); the client is then the right-most address that is
  not itself a trusted proxy. uvicorn's own proxy handling is turned off by ``scrinalia api``
  (``proxy_headers=False``), so this is the only place that decides (docs/security.md).
* Every answer, API, panel file or error, carries a Content-Security-Policy that allows the panel's own
  files and nothing inline, forbids framing (``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``),
  ``X-Content-Type-Options: nosniff`` and a ``Referrer-Policy`` that sends no URL to another origin.
"""
from __future__ import annotations

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

# The panel: its own ES modules and stylesheet, fetch() to its own origin, the inline SVG favicon.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    "manifest-src 'self'",
    "form-action 'self'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
])

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=(), usb=()"),
)
_NAMES = {name for name, _ in SECURITY_HEADERS}


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every HTTP answer (replacing any of the same name)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _NAMES]
                message = {**message, "headers": headers + list(SECURITY_HEADERS)}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def trusted_proxies(app, networks: list[str]):
    """``app`` behind the forwarded-header rewrite for ``networks`` only; with none, ``app`` itself."""
    if not networks:
        return app
    return ProxyHeadersMiddleware(app, trusted_hosts=networks)


class BoundedJsonBodies:
    """Every JSON request body read through ``scrinalia.bounded_json`` before any route sees it.

    A body larger than ``BODY_MAX_BYTES`` is a 413 (refused from its Content-Length when it has one,
    else once that much has arrived), one nested deeper than ``BODY_MAX_DEPTH`` or not JSON is a 422
    naming ``body``: nothing recursive (the JSON decoder, pydantic, the storable-value walk) ever sees a
    body that could exhaust the stack, and nothing is written. A body that passes is handed on as it
    came (the route parses it again, now known to be bounded)."""

    def __init__(self, app, *, max_bytes: int | None = None, max_depth: int | None = None) -> None:
        from scrinalia import bounded_json

        self.app = app
        self.max_bytes = bounded_json.BODY_MAX_BYTES if max_bytes is None else max_bytes
        self.max_depth = bounded_json.BODY_MAX_DEPTH if max_depth is None else max_depth

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(send, 413, "payload_too_large", f"the body is larger than {self.max_bytes} bytes")
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await _refuse(send, 413, "payload_too_large", f"the body is larger than {self.max_bytes} bytes")
                return
        if body and b"json" in headers.get(b"content-type", b"").lower():
            from scrinalia import bounded_json

            try:
                bounded_json.loads(bytes(body), max_bytes=self.max_bytes, max_depth=self.max_depth)
            except bounded_json.JsonRefused as exc:
                await _refuse(send, 422, "validation_failed", f"body: {exc.message}", fields={"body": exc.message})
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive):
    """A ``receive`` that hands the already-read body over once, then defers to the real one."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send, status: int, code: str, message: str, **extra) -> None:
    import json

    payload = json.dumps({"error": code, "message": message, **extra}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
