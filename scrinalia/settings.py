"""Settings from the environment (pydantic-settings).

Database URLs carry passwords, so they are held as ``DatabaseUrl`` values whose ``repr`` and ``str``
hide the password, and every validation error names the variable but never echoes its value.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL, make_url

SSLMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}


class SettingsError(ValueError):
    """A setting is missing or malformed. The message names the variable, never the secret."""


class DatabaseUrl:
    """A parsed PostgreSQL URL that never shows its password when printed or logged."""

    __slots__ = ("_url",)

    def __init__(self, raw: str, variable: str = "DATABASE_URL") -> None:
        self._url = parse_database_url(raw, variable)

    @property
    def url(self) -> URL:
        return self._url

    def render(self) -> str:
        """The URL with its password, for the driver only. Never log the result."""
        return self._url.render_as_string(hide_password=False)

    def redacted(self) -> str:
        return self._url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"DatabaseUrl({self.redacted()!r})"

    __str__ = redacted

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatabaseUrl) and self.render() == other.render()

    def __hash__(self) -> int:
        return hash(self.render())


def parse_database_url(raw: str, variable: str = "DATABASE_URL") -> URL:
    """Parse and normalise a PostgreSQL URL to the psycopg 3 driver; errors never contain ``raw``."""
    hint = f"{variable} must look like postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
    if not raw or not raw.strip():
        raise SettingsError(f"{variable} is empty; {hint}")
    try:
        url = make_url(raw.strip())
    except Exception:  # sqlalchemy's message quotes the input, which may hold a password
        raise SettingsError(f"{variable} is not a valid URL; {hint}") from None
    if url.drivername not in _SCHEMES:
        raise SettingsError(
            f"{variable} uses the scheme {url.drivername!r}; only PostgreSQL is supported ({hint})"
        )
    if not url.database:
        raise SettingsError(f"{variable} names no database; {hint}")
    try:
        port = url.port
    except ValueError:
        raise SettingsError(f"{variable} has a port that is not a number; {hint}") from None
    if port is not None and not 0 < port < 65536:
        raise SettingsError(f"{variable} has a port out of range; {hint}")
    return url.set(drivername="postgresql+psycopg")


_CONFIG = SettingsConfigDict(env_file=None, extra="ignore", hide_input_in_errors=True, case_sensitive=False)


class DatabaseTls(BaseSettings):
    """How every connection to PostgreSQL checks the server (docs/security.md, "TLS to the database").

    Read on its own by the engine factory, so an engine made without the full settings (a migration, a
    test, ``scrinalia dev``) still applies them; a malformed DATABASE_URL does not stop reading them.
    """

    model_config = _CONFIG

    db_sslmode: SSLMode = "prefer"
    db_sslrootcert: Path | None = None

    @field_validator("db_sslrootcert", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """``DB_SSLROOTCERT=`` (an empty line of an env file) means "not set", not the current directory."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("db_sslrootcert")
    @classmethod
    def _cert_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"DB_SSLROOTCERT={str(value)!r} is not a readable file (a PEM file of the CA that "
                             "signed the server's certificate; leave it empty or unset for libpq's default)")
        return value


class Settings(DatabaseTls):
    """What every process (API, runner, scheduler, CLI) reads from its environment."""

    model_config = _CONFIG

    database_url: SecretStr | None = Field(default=None, description="The application's database")
    runner_database_url: SecretStr | None = Field(
        default=None, description="The runner's least-privilege database URL (role scrinalia_runner)"
    )
    db_pool_size: int = Field(default=5, ge=1, le=100)
    db_pool_max_overflow: int = Field(default=10, ge=0, le=200)
    db_pool_timeout: float = Field(default=30.0, gt=0, le=600)
    scheduler_quarantine_after: int = Field(
        default=3, ge=0, le=100,
        description="Retry chains in a row that ended FAILED with one fingerprint before the scheduler "
                    "quarantines the schedule (0: never)")
    run_samples_retention_days: int = Field(
        default=14, ge=1, le=3650,
        description="Days a run's chart samples are kept (the scheduler prunes older ones)")

    @field_validator("database_url", "runner_database_url")
    @classmethod
    def _valid_url(cls, value: SecretStr | None, info) -> SecretStr | None:
        if value is not None:
            parse_database_url(value.get_secret_value(), (info.field_name or "").upper())
        return value

    def require_database_url(self) -> DatabaseUrl:
        if self.database_url is None:
            raise SettingsError("DATABASE_URL is not set; it must look like postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
        return DatabaseUrl(self.database_url.get_secret_value(), "DATABASE_URL")

    def runner_url(self) -> DatabaseUrl:
        """The runner's URL: ``RUNNER_DATABASE_URL`` when set, else ``DATABASE_URL``."""
        if self.runner_database_url is not None:
            return DatabaseUrl(self.runner_database_url.get_secret_value(), "RUNNER_DATABASE_URL")
        return self.require_database_url()


def settings_error(exc: ValidationError, prefix: str = "") -> SettingsError:
    """pydantic's error as one line per environment variable (``prefix`` + the field), without values."""
    lines = []
    for err in exc.errors(include_input=False, include_url=False):
        variable = prefix + ".".join(str(p) for p in err["loc"]).upper() if err["loc"] else "settings"
        message = str(err.get("ctx", {}).get("error") or err["msg"])
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        lines.append(message if message.startswith(variable) else f"{variable}: {message}")
    return SettingsError("; ".join(lines))


def load_tls(**overrides) -> DatabaseTls:
    """The TLS settings alone, from the environment (one line per bad variable, without values)."""
    try:
        return DatabaseTls(**overrides)
    except ValidationError as exc:
        raise settings_error(exc) from None


def load_settings(**overrides) -> Settings:
    """Read the environment; turn pydantic's error into one line per variable, without values."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise settings_error(exc) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
