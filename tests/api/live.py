"""A real API process for the tests that need one: ``uvicorn --workers N`` (or ``scrinalia api``) on a free
port, against the test's own database, with its output in a file the test can read."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scrinalia.cli.dev import wait_http
from scrinalia.db.local_cluster import free_port

REPO = Path(__file__).resolve().parents[2]

# The scrinalia loggers at INFO on stdout (the login's "password checked" lines are the tests' evidence).
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(process)d %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"out": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stdout"}},
    "loggers": {
        "scrinalia": {"level": "INFO", "handlers": ["out"], "propagate": False},
        "uvicorn": {"level": "WARNING", "handlers": ["out"], "propagate": False},
        "uvicorn.access": {"level": "WARNING", "handlers": ["out"], "propagate": False},
    },
}


class LiveApi:
    def __init__(self, base: str, log_path: Path) -> None:
        self.base = base
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def live_api(database_url: str, *, workers: int = 2, cli: bool = False, **env_extra: str) -> Iterator[LiveApi]:
    """``cli``: through ``scrinalia api`` (its own uvicorn settings); else plain ``uvicorn --factory``
    with ``--no-proxy-headers`` and the INFO log config above."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="scrinalia-live-api-"))
    log_path = work / "api.log"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SCRINALIA_WORKER_PLUGINS": "tests.api.workers_fixture:WORKERS",
        "API_COOKIE_SECURE": "false",
        "DB_POOL_SIZE": "10",
        "DB_POOL_MAX_OVERFLOW": "20",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        **env_extra,
    }
    if cli:
        argv = [sys.executable, "-m", "scrinalia.cli.main", "api", "--port", str(port), "--workers", str(workers),
                "--log-level", "warning"]
    else:
        config = work / "log.json"
        config.write_text(json.dumps(LOG_CONFIG))
        argv = [sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory", "--host", "127.0.0.1",
                "--port", str(port), "--workers", str(workers), "--no-proxy-headers", "--no-access-log",
                "--log-config", str(config)]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_http(f"{base}/healthz", 60, alive=lambda: proc.poll() is None):
            raise RuntimeError(f"the API did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        yield LiveApi(base, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
