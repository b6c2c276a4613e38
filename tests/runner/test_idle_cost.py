"""An idle daemon's cost on the shared database: lease expiry on a cadence of its own (every lease/4, not
every poll) (issue 14)."""
from __future__ import annotations

from tests.runner.conftest import wait_for


def test_an_idle_daemon_expires_leases_on_its_own_cadence_not_on_every_poll(start_runner):
    runner = start_runner("--poll", "0.05", "--heartbeat", "1", "--lease", "8")  # expiry every 2 s

    def many_polls():
        status = runner.status()
        return status if status["database"]["statements"].get("claim", 0) >= 40 else None

    status = wait_for(many_polls, timeout=60, what="40 idle polls")
    sent = status["database"]["statements"]
    # At start, then once per lease/4 of uptime (plus the one falling due now); never once per poll.
    allowed = 2 + int(status["uptime_seconds"] / 2)
    assert 1 <= sent["expire_leases"] <= allowed, sent
    assert sent["expire_leases"] * 5 < sent["claim"], sent

