"""Every CLI answers a database error with one line and exit 5, never a traceback or a password
(issue 10, defect 10; scrinalia.db.errors). A real closed port and a real refused login."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from scrinalia.db.errors import EXIT_DATABASE
from scrinalia.db.local_cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pw-not-to-be-shown"
COMMANDS = [
    ["db", "upgrade"], ["db", "current"], ["db", "runner-role"],
    ["users", "list"], ["users", "deactivate", "a@example.org"],
    ["scheduler", "list"], ["scheduler", "add", "embedding", "--every", "3600"],
    ["archive", "queues"],
]


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "RUNNER_", "DB_", "PG"))}
    env["DATABASE_URL"] = url
    return env


@pytest.fixture(params=["closed port", "refused login"])
def bad_url(request, pg_admin_url):
    if request.param == "closed port":
        return f"postgresql://scrinalia:{SECRET}@127.0.0.1:{free_port()}/scrinalia", "Connection refused"
    url = make_url(pg_admin_url).set(username="nobody_at_all", password=SECRET, database="postgres")
    return url.render_as_string(hide_password=False), 'role "nobody_at_all" does not exist'


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_one_line_and_exit_5(bad_url, argv):
    url, reason = bad_url
    proc = subprocess.run([sys.executable, "-m", "scrinalia.cli.main", *argv], cwd=ROOT, env=_env(url),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_DATABASE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("database error: ") and reason in lines[0], proc.stderr
    assert SECRET not in proc.stderr + proc.stdout


#: The line of one failed try (``database_problem``): both faults are "unreachable" (no server answer).
FAILED_TRY = "the database does not answer (OperationalError: "


def test_the_scheduler_service_logs_one_line_per_failed_tick(bad_url):
    """Until the database answers, the service retries: one WARNING line per try, naming the state
    (unreachable) and libpq's reason. It waits for two such lines, not for its watchdog."""
    url, reason = bad_url
    proc = subprocess.Popen([sys.executable, "-m", "scrinalia.cli.main", "scheduler", "run", "--interval", "0.2"],
                            cwd=ROOT, env=_env(url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(60, proc.kill)  # the read below ends at the latest when it is killed
    watchdog.start()
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if sum(FAILED_TRY in s for s in seen) >= 2:
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    output = "".join(seen) + (rest or "")
    assert proc.returncode == 0, output  # SIGTERM stopped it, not the watchdog
    failed = [s for s in seen if FAILED_TRY in s]
    assert len(failed) >= 2, output
    for line in failed:  # one line per try: the state, libpq's reason and the retry, on that one line
        assert " WARNING scrinalia.scheduler: " in line and reason in line and "; retrying in " in line, line
    assert "Traceback" not in output and SECRET not in output, output
