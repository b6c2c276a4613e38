"""Settings from the environment (pydantic-settings).

Database URLs carry passwords, so they are held as ``DatabaseUrl`` values whose ``repr`` and ``str``
hide the password, and every validation error names the variable but never echoes its value.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

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


#: libpq's connection parameters that say where the server is; everything else stays in the query.
_WHERE = ("user", "password", "dbname", "host", "port")
#: SQLAlchemy's own multi-host form (``?host=h1:p1&host=h2:p2``): a ``host`` query value with a port.
_UNKNOWN_OPTION = re.compile(r'invalid connection option "([A-Za-z_]+)"')
_HOST_WITH_PORT = re.compile(r"^[A-Za-z0-9.\-]+:\d*$")


def parse_database_url(raw: str, variable: str = "DATABASE_URL") -> URL:
    """Parse and normalise a PostgreSQL URL to the psycopg 3 driver; errors never contain ``raw``.

    Every form libpq or SQLAlchemy accepts (decision 0120): libpq's URI, with several hosts
    (``postgresql://u@h1:p1,h2:p2/db?target_session_attrs=read-write``), a unix-socket directory (``?host=/run/
    postgresql`` or a percent-encoded path as the host) or any libpq parameter in its query; libpq's
    ``key=value`` connection string; SQLAlchemy's URL (``postgresql+psycopg://``, and its multi-host
    form ``?host=h1:p1&host=h2:p2``). libpq's forms are read by libpq itself (``conninfo_to_dict``), so
    they mean exactly what they mean to psql; the result is one SQLAlchemy URL whose hosts and ports,
    when there are several (or a socket directory), travel as ``host=``/``port=`` query values, the form
    the psycopg dialect hands back to libpq unchanged. Every parameter is checked by libpq's parser
    before any connection is tried, so a misspelt one is refused at start, by name."""
    hint = (f"{variable} must look like postgresql://USER:PASSWORD@HOST:PORT/DATABASE (several hosts: "
            "postgresql://USER:PASSWORD@HOST1:PORT1,HOST2:PORT2/DATABASE?target_session_attrs=read-write)")
    if not raw or not raw.strip():
        raise SettingsError(f"{variable} is empty; {hint}")
    text = raw.strip()
    try:
        url = _libpq_url(text) if _is_libpq_form(text) else make_url(text)
    except SettingsError as exc:
        raise SettingsError(f"{variable} is not a valid URL: {exc}; {hint}") from None
    except Exception:  # the parsers' messages quote the input, which may hold a password
        raise SettingsError(f"{variable} is not a valid URL; {hint}") from None
    if url.drivername not in _SCHEMES:
        raise SettingsError(
            f"{variable} uses the scheme {url.drivername!r}; only PostgreSQL is supported ({hint})"
        )
    url = url.set(drivername="postgresql+psycopg")
    if not url.database:
        raise SettingsError(f"{variable} names no database; {hint}")
    try:
        _check_ports(url)
        _check_parameters(url)
    except SettingsError as exc:
        raise SettingsError(f"{variable} is not a valid URL: {exc}; {hint}") from None
    return url


def _is_libpq_form(text: str) -> bool:
    """libpq reads it (a ``key=value`` string, or a ``postgresql://``/``postgres://`` URI), unless it is
    SQLAlchemy's: a driver in the scheme, or its multi-host query (``host`` repeated, or ``host=h:p``)."""
    if "://" not in text:
        return True
    scheme, _, rest = text.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return False
    hosts = parse_qs(urlsplit("x://" + rest).query).get("host", [])
    return not (len(hosts) > 1 or any(_HOST_WITH_PORT.match(h) for h in hosts))


def _libpq_url(text: str) -> URL:
    """libpq's URI or ``key=value`` string as a SQLAlchemy URL (see ``parse_database_url``): one TCP host
    (or none) in the URL's own fields; several hosts, or a socket directory, as ``host=``/``port=`` query
    values, the form the psycopg dialect hands back to libpq unchanged."""
    params = _libpq_params(text)
    user, password, dbname = params.pop("user", None), params.pop("password", None), params.pop("dbname", None)
    host, port = params.pop("host", None), params.pop("port", None)
    if host is None or _is_one_tcp_host(host, port):
        return URL.create("postgresql", username=user, password=password, host=host,
                          port=_port_number(port), database=dbname, query=params)
    query = {**params, "host": host, **({"port": port} if port else {})}
    return URL.create("postgresql", username=user, password=password, database=dbname, query=query)


def _libpq_params(text: str) -> dict[str, str]:
    """libpq's own reading of ``text``; an unknown parameter is refused by its name alone (a name is no
    secret; libpq's message may quote the URI, password included)."""
    from psycopg.conninfo import conninfo_to_dict

    if "://" in text:  # name a misspelt query parameter before libpq quotes the whole URI
        _refuse_unknown(parse_qs(urlsplit(text).query).keys())
    try:
        parsed = conninfo_to_dict(text)
    except Exception as exc:  # keep only an unknown option's NAME from libpq's message (never a value)
        unknown = _UNKNOWN_OPTION.search(str(exc))
        if unknown:
            raise SettingsError(f"libpq knows no connection parameter {unknown.group(1)}") from None
        raise
    return {k: str(v) for k, v in parsed.items()}


def _is_one_tcp_host(host: str, port: str | None) -> bool:
    """One host name or address with at most one port: what SQLAlchemy's URL holds in its own fields."""
    return "," not in host and not host.startswith("/") and "," not in (port or "")


def _port_number(port: str | None) -> int | None:
    if port is None:
        return None
    if not port.isdigit():
        raise SettingsError("its port is not a number")
    return int(port)


def _check_ports(url: URL) -> None:
    """Every port the URL names, in its authority or its query, is a number from 1 to 65535."""
    try:
        port = url.port
    except ValueError:
        raise SettingsError("its port is not a number") from None
    ports = ([port] if port is not None else []) + _query_ports(url)
    if any(not 0 < p < 65536 for p in ports):
        raise SettingsError("it has a port that is not a number from 1 to 65535")


def _query_ports(url: URL) -> list[int]:
    """The ports of the query's ``port`` values (each may list several, comma-separated); -1 stands for
    one that is not a number, so the range check refuses it."""
    given = url.query.get("port")
    items = (given,) if isinstance(given, str) else (given or ())
    texts = [p.strip() for item in items for p in item.split(",")]
    return [int(p) if p.isdigit() else -1 for p in texts if p]


def _check_parameters(url: URL) -> None:
    """What the driver will get, through libpq's own parser: an unknown parameter, a host/port count
    that does not match, or a mix of the two multi-host forms is refused now, not at the first connect."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    if url.host and "host" in url.query:
        raise SettingsError("it names its hosts twice (before the path and in ?host=)")
    try:
        _, params = PGDialect_psycopg().create_connect_args(url)
    except Exception:  # sqlalchemy's ArgumentError: mixed multi-host forms, unmatched hosts and ports
        raise SettingsError("its hosts and ports do not match (one port, or one per host)") from None
    hosts = str(params.get("host") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(hosts) > 1 and len(ports) > 1 and len(hosts) != len(ports):
        raise SettingsError("its hosts and ports do not match (one port, or one per host)")
    _refuse_unknown(params)


def _refuse_unknown(names: Iterable[str]) -> None:
    from psycopg.conninfo import make_conninfo

    unknown: list[str] = []
    for name in names:
        try:
            make_conninfo("", **{name: "1"})
        except Exception:
            unknown.append(name)
    if unknown:
        raise SettingsError(f"libpq knows no connection parameter {', '.join(sorted(unknown))}")


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
        """Opened here, not only looked at: a CA file the service's user cannot read (``0600 root``) would
        otherwise pass the start and fail every connection later, as a TLS error far from its cause."""
        if value is None:
            return value
        if not value.is_file():
            raise ValueError(f"DB_SSLROOTCERT={str(value)!r} is not a readable file (a PEM file of the CA that "
                             "signed the server's certificate; leave it empty or unset for libpq's default)")
        try:
            with value.open("rb"):
                pass
        except OSError as exc:
            reason = (exc.strerror or "cannot be opened").lower()
            raise ValueError(f"DB_SSLROOTCERT={str(value)!r} is not a readable file ({reason} for this process's "
                             "user: make it readable by the service's user, e.g. mode 0640 and group scrinalia)"
                             ) from None
        return value


class Settings(DatabaseTls):
    """What every process (API, runner, scheduler, CLI) reads from its environment."""

    model_config = _CONFIG

    database_url: SecretStr | None = Field(default=None, description="The application's database")
    runner_database_url: SecretStr | None = Field(
        default=None, description="The runner's least-privilege database URL (role scrinalia_runner)"
    )
    database_session_url: SecretStr | None = Field(
        default=None, description="A direct connection (no transaction pooler) for LISTEN and the scheduler's lock"
    )
    runner_database_session_url: SecretStr | None = Field(
        default=None, description="The runner's direct connection for its LISTEN (else DATABASE_SESSION_URL)"
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

    @field_validator("database_url", "runner_database_url", "database_session_url", "runner_database_session_url")
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

    def session_url(self) -> DatabaseUrl | None:
        """``DATABASE_SESSION_URL``: where the API's LISTEN and the scheduler's leader lock connect when
        ``DATABASE_URL`` goes through a transaction pooler (decision 0122); None: ``DATABASE_URL``."""
        if self.database_session_url is None:
            return None
        return DatabaseUrl(self.database_session_url.get_secret_value(), "DATABASE_SESSION_URL")

    def runner_session_url(self) -> DatabaseUrl | None:
        """The runner's LISTEN: ``RUNNER_DATABASE_SESSION_URL`` when set, else ``DATABASE_SESSION_URL``
        (as ``runner_url`` falls back to ``DATABASE_URL``); None: the runner's own URL."""
        if self.runner_database_session_url is not None:
            return DatabaseUrl(self.runner_database_session_url.get_secret_value(), "RUNNER_DATABASE_SESSION_URL")
        return self.session_url()


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
