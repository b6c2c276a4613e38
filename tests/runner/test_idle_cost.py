"""An idle daemon's cost on the shared database: lease expiry on a cadence of its own (every lease/4, not
every poll), a child that opens no session it does not need (issue 14)."""
from __future__ import annotations

from scrinalia.domains.archive.worker_settings import put_settings
from tests.runner.conftest import enqueue, wait_for, wait_status


def test_an_idle_daemon_expires_leases_on_its_own_cadence_not_on_every_poll(start_runner):
    runner = start_runner("--no-listen", "--poll", "0.05", "--heartbeat", "1", "--lease", "8")  # expiry every 2 s
    # (--no-listen: every poll is a poll; while listening the safety poll is far slower)

    def many_polls():
        status = runner.status()
        return status if status["database"]["statements"].get("claim", 0) >= 40 else None

    status = wait_for(many_polls, timeout=60, what="40 idle polls")
    sent = status["database"]["statements"]
    # At start, then once per lease/4 of uptime (plus the one falling due now); never once per poll.
    allowed = 2 + int(status["uptime_seconds"] / 2)
    assert 1 <= sent["expire_leases"] <= allowed, sent
    assert sent["expire_leases"] * 5 < sent["claim"], sent



def test_a_worker_that_never_touches_the_database_opens_no_session(start_runner, engine):
    """The supervisor reads the worker's settings on its warm connection and hands them over; the child's
    engine connects on its first statement only, so a worker that reads nothing never connects."""
    put_settings(engine, "sessions", {"options": {"flavour": "persisted"}}, changed_by="test")
    start_runner("--poll", "0.1", "--heartbeat", "1", "--lease", "8")
    run = wait_status(engine, enqueue(engine, "sessions").run_id, "SUCCESS")
    assert run.result == {"sessions": 0, "options": {"flavour": "persisted"}}
    assert run.options == {"flavour": "persisted"}  # what record_start wrote: the persisted layer applied
