"""Every session is bounded by the server (issue 9; decisions 0101, 0102): a child's session carries
statement, lock and idle-in-transaction timeouts derived from the lease; every connection of the engine
factory carries TCP keepalives and a TCP user timeout on the server's side too; the scheduler's are
bounded. Read back with SHOW on real sessions over TCP."""
from __future__ import annotations

import json
import subprocess

from sqlalchemy import text

from scrinalia.db.engine import create_engine_from_url
from scrinalia.scheduler.service import SESSION_BOUNDS
from tests.runner.conftest import ROOT, RUNNER


def _show(url: str, names: tuple[str, ...], **kwargs) -> dict[str, str]:
    engine = create_engine_from_url(url, **kwargs)
    try:
        with engine.connect() as conn:
            return {n: conn.execute(text(f"SHOW {n}")).scalar_one() for n in names}
    finally:
        engine.dispose()


def test_every_connection_has_keepalives_on_the_server_side(database_url):
    shown = _show(database_url, ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
                                 "tcp_user_timeout"))
    assert shown == {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                     "tcp_user_timeout": "10000"}


def test_a_caller_s_options_are_kept_beside_the_keepalives(database_url):
    shown = _show(database_url, ("tcp_keepalives_idle", "lock_timeout"),
                  connect_args={"options": "-c lock_timeout=1234"})
    assert shown == {"tcp_keepalives_idle": "5", "lock_timeout": "1234ms"}


def test_the_scheduler_s_sessions_are_bounded(database_url):
    shown = _show(database_url, ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"),
                  connect_args=dict(SESSION_BOUNDS))
    assert shown == {"statement_timeout": "10s", "lock_timeout": "5s", "idle_in_transaction_session_timeout": "10s"}


def test_a_child_s_session_is_bounded_by_its_lease(runner_env):
    proc = subprocess.run([*RUNNER, "run", "session-settings", "--lease", "8", "--heartbeat", "2", "--json"],
                          cwd=ROOT, env=runner_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result == {"statement_timeout": "4s", "lock_timeout": "2s", "idle_in_transaction_session_timeout": "4s",
                      "tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                      "tcp_user_timeout": "10000"}
