"""The wheel installed into a fresh virtualenv, with no checkout anywhere on ``sys.path``, works as an
operator's installation: the commands answer, ``db upgrade`` migrates a real PostgreSQL, ``install-units``
writes units that ``systemd-analyze verify`` accepts, and the installed API serves the panel.

The fresh venv is made once per session with uv (its cache makes the install take seconds; pip takes a
minute for the same wheels: decision 0152). Every command runs from a temporary directory, without
PYTHONPATH, so only the installed files can answer.
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scrinalia.db.local_cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@dataclass(frozen=True)
class Installed:
    venv: Path
    site_packages: Path
    workdir: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
        return {**keep, **extra}

    def run(self, argv: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.workdir, env=self.env(**env), capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="session")
def installed(built_dist, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel-install")
    venv = root / "venv"
    uv = [sys.executable, "-m", "uv"]
    started = time.monotonic()
    subprocess.run([*uv, "venv", "-q", "--python", sys._base_executable, str(venv)], check=True,  # type: ignore[attr-defined]  # CPython's own
                   capture_output=True, timeout=120)
    proc = subprocess.run([*uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                           f"{built_dist.wheel}[api]"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"fresh venv with the wheel and the api extra in {time.monotonic() - started:.1f} s")
    site_packages = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, cwd=root).stdout.strip())
    workdir = root / "elsewhere"
    workdir.mkdir()
    return Installed(venv=venv, site_packages=site_packages, workdir=workdir)


def test_the_code_that_runs_is_the_installed_one(installed: Installed) -> None:
    proc = installed.run([installed.bin("python"), "-c",
                          "import scrinalia, runner, scrinalia.bundled as b; "
                          "print(scrinalia.__file__); print(runner.__file__); print(b.migrations_dir()); "
                          "print(b.ui_dir()); print(b.systemd_dir())"])
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert Path(line).is_relative_to(installed.site_packages), line
    assert str(ROOT) not in proc.stdout


def test_version_and_help(installed: Installed) -> None:
    version = installed.run([installed.bin("scrinalia"), "--version"])
    assert version.returncode == 0 and VERSION in version.stdout, version.stdout + version.stderr
    help_ = installed.run([installed.bin("scrinalia-runner"), "--help"])
    assert help_.returncode == 0, help_.stderr
    for command in ("daemon", "status", "run"):
        assert command in help_.stdout
    assert "install-units" in installed.run([installed.bin("scrinalia"), "--help"]).stdout


def test_site_packages_gains_no_migrations_or_ui_package(installed: Installed) -> None:
    entries = {p.name for p in installed.site_packages.iterdir()}
    assert {"scrinalia", "runner"} <= entries
    assert not entries & {"migrations", "ui", "systemd"}, entries
    proc = installed.run([installed.bin("python"), "-c", "import migrations"])
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
    proc = installed.run([installed.bin("python"), "-c",
                          "from importlib.metadata import distribution as d; "
                          "print(sorted({f.parts[0] for f in d('scrinalia-runner').files if f.suffix == '.py'}))"])
    assert proc.stdout.strip() == "['runner', 'scrinalia']", proc.stdout + proc.stderr


def test_db_upgrade_migrates_an_empty_database(installed: Installed, empty_database_url: str) -> None:
    upgrade = installed.run([installed.bin("scrinalia"), "db", "upgrade"], DATABASE_URL=empty_database_url)
    assert upgrade.returncode == 0, upgrade.stderr
    current = installed.run([installed.bin("scrinalia"), "db", "current"], DATABASE_URL=empty_database_url)
    assert current.returncode == 0, current.stdout + current.stderr  # exit 1 unless at the bundled head
    head = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("[0-9]*.py"))[-1].split("_")[0]
    assert f"database: {head}" in current.stdout, current.stdout


def test_install_units_writes_units_that_verify(installed: Installed, tmp_path: Path) -> None:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    proc = installed.run([installed.bin("scrinalia"), "install-units", "api", "scheduler", "runner",
                          "--root", str(tmp_path), "--user", user, "--group", group])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    units = sorted((tmp_path / "etc" / "systemd" / "system").glob("*.service"))
    assert [u.name for u in units] == ["scrinalia-api.service", "scrinalia-runner.service",
                                       "scrinalia-scheduler.service"]
    for unit in units:
        text = unit.read_text()
        assert not re.search(r"@[A-Z]+@", text), unit  # every placeholder filled in (@system-service is not one)
        (exec_start,) = re.findall(r"^ExecStart=(\S+)", text, re.M)
        assert Path(exec_start).parent == installed.venv / "bin" and os.access(exec_start, os.X_OK)
        assert f"User={user}\n" in text and "EnvironmentFile=/etc/scrinalia/" in text
    config = tmp_path / "etc" / "scrinalia"
    assert config.stat().st_mode & 0o777 == 0o750
    for env_file in ("scrinalia.env", "runner.env"):
        assert (config / env_file).stat().st_mode & 0o777 == 0o640
        assert "DB_SSLROOTCERT=/etc/scrinalia/db-ca.pem" in (config / env_file).read_text()

    # A second call rewrites the units and keeps the env files the operator has edited.
    (config / "runner.env").write_text("RUNNER_DATABASE_URL=postgresql://edited@db/x\n")
    again = installed.run([installed.bin("scrinalia"), "install-units", "runner", "--root", str(tmp_path),
                           "--user", user, "--group", group])
    assert again.returncode == 0 and "kept" in again.stdout, again.stdout + again.stderr
    assert (config / "runner.env").read_text() == "RUNNER_DATABASE_URL=postgresql://edited@db/x\n"

    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is not installed here: the units were written but not verified")
    verify = subprocess.run([SYSTEMD_ANALYZE, "verify", *map(str, units)], capture_output=True, text=True,
                            timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The check means something: the raw template (placeholders unfilled) does not verify.
    raw = subprocess.run([SYSTEMD_ANALYZE, "verify", str(ROOT / "systemd" / "scrinalia-api.service")],
                         capture_output=True, text=True, timeout=60)
    assert raw.returncode != 0


def test_install_units_refuses_a_missing_user(installed: Installed, tmp_path: Path) -> None:
    proc = installed.run([installed.bin("scrinalia"), "install-units", "api", "--root", str(tmp_path),
                          "--user", "no-such-user-scrinalia"])
    assert proc.returncode != 0 and "useradd --system" in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())


def _modules(source: str) -> list[str]:
    return re.findall(r"""(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s*['"](\.{1,2}/[^'"]+)['"]""", source)


def test_the_installed_api_serves_the_panel(installed: Installed, database_url: str) -> None:
    port = free_port()
    api = subprocess.Popen([installed.bin("scrinalia"), "api", "--host", "127.0.0.1", "--port", str(port)],
                           cwd=installed.workdir, env=installed.env(DATABASE_URL=database_url),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            deadline = time.monotonic() + 60
            while True:
                assert api.poll() is None, api.stdout.read() if api.stdout else ""
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the installed API did not answer /healthz"
                time.sleep(0.2)
            index = client.get("/")
            assert index.status_code == 200 and index.text == (ROOT / "ui" / "index.html").read_text()
            (entry,) = re.findall(r'<script type="module" src="([^"]+)"', index.text)
            # Every module of the panel's import graph, from the entry point: served, as JavaScript.
            seen: set[str] = set()
            pending = [entry]
            while pending:
                path = os.path.normpath(pending.pop())
                if path in seen:
                    continue
                seen.add(path)
                answer = client.get(f"/{path}")
                assert answer.status_code == 200, path
                assert "javascript" in answer.headers["content-type"], (path, answer.headers["content-type"])
                assert answer.text == (ROOT / "ui" / path).read_text(), path
                pending.extend(os.path.join(os.path.dirname(path), m) for m in _modules(answer.text))
            assert len(seen) >= 10, seen
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=30)


@pytest.mark.browser
def test_the_installed_panel_runs_in_a_browser(installed: Installed, database_url: str, browser) -> None:
    """The modules execute: chromium shows the login form the panel's JavaScript draws."""
    port = free_port()
    api = subprocess.Popen([installed.bin("scrinalia"), "api", "--host", "127.0.0.1", "--port", str(port)],
                           cwd=installed.workdir, env=installed.env(DATABASE_URL=database_url,
                                                                     API_COOKIE_SECURE="false"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert api.poll() is None and time.monotonic() < deadline, "the installed API did not start"
            time.sleep(0.2)
        page = browser.new_page()
        try:
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("input[type=password]", timeout=15_000)
            assert not errors, errors
        finally:
            page.close()
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=30)
