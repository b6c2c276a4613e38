"""The database stops answering: the supervisor kills its children before its leases end (self-fence),
claims nothing, and when the database answers again closes the runs it still holds."""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from scrinalia.domains.archive import ledger
from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow


def test_a_database_outage_longer_than_the_lease_fences_the_children(start_runner, engine, admin_engine,
                                                                      database_url):
    name = make_url(database_url).database
    runner = start_runner("--heartbeat", "0.5", "--lease", "4", "--poll", "0.2")
    run = enqueue(engine, "slow", units=10_000, pause=0.1)
    child = runner.child_for(run.run_id)
    try:
        with admin_engine.connect() as conn:  # no new connection; the supervisor's are cut
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :d AND application_name = 'scrinalia-runner'"), {"d": name})
        status = wait_for(lambda: (s := runner.status())["state"] == "fenced" and s, 30,
                          what="the supervisor to self-fence")
        assert status["database"]["state"] == "unreachable"
        wait_for(lambda: not pid_alive(child["pid"]), 10, what="the child to be killed")
        assert "self-fence" in runner.log()
        queued = enqueue(engine, "ok")  # the test's own connection is still open
        assert ledger.get_run(engine, run.run_id).status == "RUNNING"  # nothing written meanwhile
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    # The database answers: the run it still holds is closed, fenced; claiming resumes.
    row = wait_status(engine, run.run_id, "INTERRUPTED", timeout=30)
    assert row.exit_reason == "lease-lost"
    # Closed by this supervisor if it still held the row when the database came back, else by the
    # expiry (when the outage outlasted the lease): both say why.
    assert row.error.startswith(("SelfFenced:", "LeaseExpired:")), row.error
    assert wait_status(engine, queued.run_id, "SUCCESS")
    assert runner.status()["state"] == "running"
