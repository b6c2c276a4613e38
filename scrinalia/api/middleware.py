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
