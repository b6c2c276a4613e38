"""The API's own settings (environment variables prefixed ``API_``), next to the shared ``Settings``.

The only secret is ``API_METRICS_TOKEN`` (held as a ``SecretStr``, never echoed). The session, CSRF and
device tokens are random per login and live in the database (the session's and the device's as their
SHA-256; the CSRF token as it is, worth nothing without the session's cookie), so the API needs no
signing key and every process of ``uvicorn --workers N`` agrees without sharing memory.
"""
from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scrinalia.settings import settings_error


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="API_", env_file=None, extra="ignore", hide_input_in_errors=True, case_sensitive=False
    )

    # --- the session cookie (scrinalia_session) ---
    cookie_secure: bool = Field(default=True,
                                description="Send the cookie over HTTPS only (turn off for plain-HTTP development)")
    cookie_samesite: Literal["lax", "strict"] = "strict"
    session_hours: float = Field(default=12.0, gt=0, le=24 * 30)

    # --- login protection ---
    login_rate_limit: int = Field(default=10, ge=1, le=10_000,
                                  description="Login attempts per address per window, per process")
    login_rate_window_seconds: float = Field(default=60.0, gt=0, le=86_400)
    lockout_threshold: int = Field(default=5, ge=1, le=100, description="Consecutive failures that lock an account")
    lockout_base_seconds: float = Field(default=60.0, gt=0, le=86_400,
                                        description="First lockout; each next one doubles")
    lockout_max_seconds: float = Field(default=86_400.0, gt=0, le=30 * 86_400)
    device_cookie_days: int = Field(
        default=90, ge=1, le=400,
        description="Life of the device cookie a browser gets at a successful login (it keeps the browser "
                    "out of the account-wide lock; docs/security.md)",
    )
    trusted_proxies: str = Field(
        default="",
        description="Comma-separated addresses or CIDRs of reverse proxies whose X-Forwarded-For and "
                    "X-Forwarded-Proto are believed; empty (default): none, the TCP peer is the client",
    )

    # --- passwords ---
    password_min_length: int = Field(default=12, ge=8, le=128)

    # --- pages and features ---
    runs_page_max: int = Field(default=200, ge=1, le=1000)
    failures_max_days: int = Field(default=365, ge=1, le=3650)
    metrics_enabled: bool = True
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for GET /metrics (a scraper sends Authorization: Bearer ...); without it, "
                    "only an ADMIN session may read the metrics",
    )
    counts_max_age_seconds: float = Field(
        default=0.0, ge=0, le=3600,
        description="0 (default): compute the per-worker unit counts on every request; > 0: serve them up to "
                    "this old while one thread refreshes them (an opt-in for archives far beyond 100k documents)",
    )
    events_stream_seconds: float = Field(
        default=300.0, ge=0, le=3600,
        description="How long one live-panel event stream lasts before the browser reconnects (and the "
                    "session is checked again); 0 ends it right after its hello",
    )
    ui_dir: str | None = Field(default=None,
                               description="Static panel directory; default: the panel installed with the package "
                                           "(ui/ of a checkout)")

    @field_validator("trusted_proxies")
    @classmethod
    def _valid_networks(cls, value: str) -> str:
        trusted_networks(value)
        return value

    @field_validator("metrics_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("API_METRICS_TOKEN must be at least 16 characters")
        return value

    @property
    def proxy_networks(self) -> list[str]:
        return [str(n) for n in trusted_networks(self.trusted_proxies)]


def trusted_networks(value: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``10.0.0.5, 192.168.0.0/24, ::1`` as networks; a typo is an error, never a silent literal."""
    out = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"API_TRUSTED_PROXIES: {item!r} is not an address or a CIDR") from None
    return out


def load_api_settings(**overrides) -> ApiSettings:
    try:
        return ApiSettings(**overrides)
    except ValidationError as exc:
        raise settings_error(exc, prefix="API_") from None
