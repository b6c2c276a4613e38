"""The operator's words (issue: wording): one rule for plurals, an empty DB_SSLROOTCERT is unset, and a
DB_SSLROOTCERT that is no file, or a file this process cannot read, says what it wants. The CLIs run as
processes against a real database."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scrinalia.settings import DatabaseTls, SettingsError
from scrinalia.wording import plural, plural_word

ROOT = Path(__file__).resolve().parents[2]


def test_plurals() -> None:
    assert plural(1, "schedule") == "1 schedule" and plural(0, "schedule") == "0 schedules"
    assert plural(3, "schedule") == "3 schedules" and plural_word(200, "document") == "documents"
    assert plural_word(2, "box") == "boxes" and plural_word(2, "units") == "units"


def test_an_empty_db_sslrootcert_is_unset_and_a_missing_file_is_named(monkeypatch) -> None:
    monkeypatch.setenv("DB_SSLROOTCERT", "")
    assert DatabaseTls().db_sslrootcert is None
    monkeypatch.setenv("DB_SSLROOTCERT", "  ")
    assert DatabaseTls().db_sslrootcert is None
    monkeypatch.setenv("DB_SSLROOTCERT", "/nonexistent/ca.pem")
    with pytest.raises(Exception, match=r"DB_SSLROOTCERT='/nonexistent/ca.pem' is not a readable file"):
        DatabaseTls()
    assert issubclass(SettingsError, Exception)


def test_the_clis_read_an_empty_db_sslrootcert_as_unset(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "DB_SSLROOTCERT": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "runner.cli", "status", "--all"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "no runners in the registry" in done.stdout
    env["DB_SSLROOTCERT"] = "/nonexistent/ca.pem"
    bad = subprocess.run([sys.executable, "-m", "runner.cli", "status", "--all"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "DB_SSLROOTCERT='/nonexistent/ca.pem' is not a readable file" in bad.stderr
    assert "DB_SSLROOTCERT . " not in bad.stderr


def _as_a_service_user() -> list[str]:
    """A command prefix under which file modes hold: root reads any file, so as root the child runs without
    the capabilities that let it (the service's user, which is not root, has neither)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def test_a_db_sslrootcert_the_service_cannot_read_stops_the_start(database_url: str, tmp_path: Path) -> None:
    ca = tmp_path / "db-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {**os.environ, "DATABASE_URL": database_url, "DB_SSLROOTCERT": str(ca), "PYTHONPATH": str(ROOT)}
    check = [*_as_a_service_user(), sys.executable, "-c", "from scrinalia.settings import DatabaseTls; DatabaseTls()"]
    ca.chmod(0o644)
    readable = subprocess.run(check, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert readable.returncode == 0, readable.stderr
    if os.geteuid() == 0:
        os.chown(ca, 65534, 65534)  # another user's file, mode 0600
        ca.chmod(0o600)
    else:
        ca.chmod(0o000)
    bad = subprocess.run([*_as_a_service_user(), sys.executable, "-m", "runner.cli", "status", "--all"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2, bad.stderr
    assert f"DB_SSLROOTCERT={str(ca)!r} is not a readable file (permission denied" in bad.stderr
    assert "Traceback" not in bad.stderr
