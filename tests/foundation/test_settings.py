"""Settings: clear errors that name the variable, and a password that never shows."""
from __future__ import annotations

import logging

import pytest

from scrinalia.db.engine import create_engine_from_url
from scrinalia.settings import DatabaseUrl, SettingsError, load_settings

SECRET = "s3cr3t-p@ss"
URL = f"postgresql://scrinalia:{SECRET.replace('@', '%40')}@db.example.org:5432/scrinalia"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("DATABASE_URL", "RUNNER_DATABASE_URL", "DB_SSLMODE", "DB_SSLROOTCERT", "DB_POOL_SIZE"):
        monkeypatch.delenv(var, raising=False)


def test_defaults(monkeypatch):
    settings = load_settings()
    assert settings.db_sslmode == "prefer" and settings.database_url is None
    with pytest.raises(SettingsError, match="DATABASE_URL is not set"):
        settings.require_database_url()


def test_runner_url_falls_back_to_database_url(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", URL)
    assert load_settings().runner_url().url.username == "scrinalia"
    monkeypatch.setenv("RUNNER_DATABASE_URL", URL.replace("scrinalia:", "scrinalia_runner:", 1))
    assert load_settings().runner_url().url.username == "scrinalia_runner"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("DATABASE_URL", f"mysql://u:{SECRET}@h/db", "only PostgreSQL"),
        ("DATABASE_URL", f"postgresql://u:{SECRET}@h:notaport/db", "not a valid URL"),
        ("DATABASE_URL", f"postgresql://u:{SECRET}@h:5432", "names no database"),
        ("DATABASE_URL", f"not a url {SECRET}", "not a valid URL"),
        ("RUNNER_DATABASE_URL", f"http://u:{SECRET}@h/db", "only PostgreSQL"),
        ("DB_SSLMODE", "sometimes", "DB_SSLMODE"),
        ("DB_POOL_SIZE", "0", "DB_POOL_SIZE"),
    ],
)
def test_malformed_settings_name_the_variable_and_hide_the_secret(monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert variable in message and expected in message
    assert SECRET not in message and SECRET not in repr(err.value)
    # The pydantic error it replaces stays as __context__ (for debugging): it must not hold the secret either.
    assert SECRET not in str(err.value.__context__)


def test_password_never_in_repr_str_or_logs(monkeypatch, caplog):
    monkeypatch.setenv("DATABASE_URL", URL)
    settings = load_settings()
    url = settings.require_database_url()
    for text in (repr(settings), str(settings), repr(url), str(url), url.redacted(), repr(settings.model_dump())):
        assert SECRET not in text and "s3cr3t" not in text
    assert "s3cr3t" in url.render()  # the driver still gets it
    caplog.set_level(logging.DEBUG)
    engine = create_engine_from_url(url, settings=settings, echo=True)
    logging.getLogger("test").info("engine %r url %s", engine, url)
    assert "s3cr3t" not in caplog.text and "s3cr3t" not in repr(engine)


def test_database_url_normalises_the_driver():
    assert DatabaseUrl("postgres://u@h/db").url.drivername == "postgresql+psycopg"
    assert DatabaseUrl("postgresql+psycopg://u@h/db").url.database == "db"
