"""A SIGSTOPped fork server (issue 9): the loop keeps answering ``status``, its heartbeats go on, no
child outlives its row; the run whose spawn it did not answer is not failed (no worker code ran): it
stays claimed, waits for the launcher, and runs once the fork server answers again (decision 0136);
nothing more is claimed meanwhile."""
from __future__ import annotations

import os
import signal
import time

import pytest
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from tests.runner.conftest import enqueue, pid_alive, wait_for, wait_status

pytestmark = pytest.mark.slow


def _db_now(engine):
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def test_a_stopped_fork_server_does_not_stop_the_loop(start_runner, engine):
    # Without a standby child (decision 0341): it would take the first run without the fork server.
    runner = start_runner("--heartbeat", "1", "--lease", "4", "--poll", "0.2", "--concurrency", "2", "--no-standby")
    server = runner.status()["launcher"]["pid"]
    running = enqueue(engine, "slow", units=200, pause=0.1)
    child = runner.child_for(running.run_id)
    os.kill(server, signal.SIGSTOP)
    try:
        blocked = enqueue(engine, "ok")  # claimed: its spawn is not answered
        wait_for(lambda: ledger.get_run(engine, blocked.run_id).status == "RUNNING", 10, what="the claim")
        wait_for(lambda: "it waits for the launcher" in runner.log(), 10, what="the unanswered spawn")
        beats = []
        until = time.monotonic() + 10  # 2.5 leases
        while time.monotonic() < until:
            status = runner.status(timeout=2.0)  # the loop answers
            assert status["launcher"]["stalled"] is True
            beats.append(status["database"]["last_heartbeat_age_seconds"])
            row = ledger.get_run(engine, running.run_id)
            now = _db_now(engine)
            if pid_alive(child["pid"]):  # no child outlives its row
                assert row.status == "RUNNING" and row.lease_expires_at > now, (row, now)
            waiting = ledger.get_run(engine, blocked.run_id)
            assert waiting.status == "RUNNING" and waiting.lease_expires_at > now, waiting  # not failed: held
            assert not [c for c in status["children"] if c["run_id"] == str(blocked.run_id)]  # no child
            time.sleep(0.2)
        assert max(beats) < 3.0, beats  # heartbeats went on (every 1 s)
        assert ledger.get_run(engine, running.run_id).status == "RUNNING"
    finally:
        os.kill(server, signal.SIGCONT)
    wait_for(lambda: runner.status()["launcher"]["stalled"] is False, 10, what="the fork server to answer")
    done = wait_status(engine, blocked.run_id, "SUCCESS", timeout=30)  # spawned again: it ran, once
    assert done.error is None and done.exit_reason is None, done
    after = enqueue(engine, "ok")
    assert wait_status(engine, after.run_id, "SUCCESS", timeout=30)
    assert runner.status()["launcher"]["pid"] == server  # the same fork server, not restarted
    ledger.request_cancel(engine, running.run_id, "test")
    assert wait_status(engine, running.run_id, ("CANCELLED", "SUCCESS"), timeout=30)


def test_a_control_client_that_trickles_its_request_cannot_hold_the_loop(start_runner, engine):
    import socket
    import threading

    runner = start_runner("--heartbeat", "1", "--lease", "4", "--poll", "0.2")
    running = enqueue(engine, "slow", units=100, pause=0.1)
    child = runner.child_for(running.run_id)
    stop = threading.Event()

    def trickle() -> None:  # one byte every 0.2 s, never a newline
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(runner.socket_path))
            while not stop.is_set():
                try:
                    sock.sendall(b" ")
                except OSError:
                    return
                time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        for _ in range(10):
            status = runner.status(timeout=2.0)
            assert status["database"]["last_heartbeat_age_seconds"] < 2.5, status["database"]
            time.sleep(0.3)
        assert pid_alive(child["pid"])
    finally:
        stop.set()
        thread.join(timeout=5)
    ledger.request_cancel(engine, running.run_id, "test")
    assert wait_status(engine, running.run_id, ("CANCELLED", "SUCCESS"), timeout=30)


def test_a_fork_server_restart_preloads_off_the_loop(start_runner, runner_env, engine):
    env = dict(runner_env, SLOW_IMPORT_SECONDS="5")
    runner = start_runner("--heartbeat", "1", "--lease", "4", "--poll", "0.2", env=env,
                          preload="tests.runner.slow_import")
    first = runner.status()["launcher"]["pid"]
    os.kill(first, signal.SIGKILL)
    starting = wait_for(lambda: (s := runner.status(timeout=2.0))["launcher"].get("starting") and s, 10,
                        what="the fork server restarting")
    assert starting["launcher"]["pid"] != first
    queued = enqueue(engine, "ok")  # waits for the new fork server: nothing is claimed meanwhile
    answered = 0
    while runner.status(timeout=1.0)["launcher"]["starting"]:  # the loop answers while it preloads
        answered += 1
        assert ledger.get_run(engine, queued.run_id).status == "QUEUED"
        time.sleep(0.2)
    assert answered >= 5
    assert wait_status(engine, queued.run_id, "SUCCESS", timeout=30)
    assert "fork server restarting" in runner.log()
