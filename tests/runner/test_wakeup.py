"""Pick-up on notification and progress within a second, with real runner processes (decision 0080).

The runners here poll every 30 s and beat every 20 s, so a claim or a progress write that happens
within a few seconds can only come from the notification, or from the progress statement.
"""
from __future__ import annotations

import pytest
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from tests.runner.conftest import enqueue, wait_for, wait_status

pytestmark = pytest.mark.slow

SLOW_POLL = ("--heartbeat", "20", "--lease", "200", "--poll", "30", "--listen-poll", "30")


def _listeners(engine, terminate: bool = False) -> list:
    """The runner's LISTEN backends in this test's database (a fresh snapshot each call)."""
    what = "pg_terminate_backend(pid)" if terminate else "pid"
    with engine.connect() as conn:
        return conn.execute(text(
            f"SELECT {what} FROM pg_stat_activity WHERE application_name = 'scrinalia-runner-listen' "
            "AND datname = current_database()")).scalars().all()


def _terminate_listener(engine) -> list:
    return _listeners(engine, terminate=True)


def _past_first_poll(runner) -> None:
    """The loop polls once at start; two more answered status requests mean that tick is over."""
    runner.status()
    runner.status()


def test_a_queued_run_is_claimed_on_its_notification_and_progress_is_written_within_a_second(
    start_runner, engine
):
    runner = start_runner(*SLOW_POLL)
    _past_first_poll(runner)
    run = enqueue(engine, "slow", units=40, pause=0.25)
    # Claimed long before the 30 s poll could have.
    wait_status(engine, run.run_id, "RUNNING", timeout=10)
    # Progress reaches the row although no heartbeat (20 s) has run since the claim.
    first = wait_for(lambda: (ledger.get_run(engine, run.run_id).progress or {}).get("done"), 10,
                     what="progress in the row")
    wait_for(lambda: (ledger.get_run(engine, run.run_id).progress or {}).get("done", 0) > first, 10,
             what="progress moving in the row")
    ledger.request_cancel(engine, run.run_id, "test")
    wait_status(engine, run.run_id, "CANCELLED", timeout=30)
    assert f"run {run.run_id}" in runner.log()


def test_the_listen_connection_comes_back_and_claims_again(start_runner, engine):
    runner = start_runner(*SLOW_POLL)
    _past_first_poll(runner)
    killed = wait_for(lambda: _terminate_listener(engine), 10, what="the runner's listen backend")
    assert killed == [True]
    wait_for(lambda: "listening again" in runner.log(), 15, what="the runner to listen again")
    run = enqueue(engine, "ok")
    wait_status(engine, run.run_id, "SUCCESS", timeout=15)


def test_no_listen_polls_only(start_runner, runner_env, engine):
    env = dict(runner_env, SCRINALIA_RUNNER_LISTEN="0")
    runner = start_runner("--heartbeat", "1", "--lease", "10", "--poll", "0.3", env=env)
    assert "not listening for notifications" in runner.log()
    listeners = len(_listeners(engine))
    assert listeners == 0
    run = enqueue(engine, "ok")
    wait_status(engine, run.run_id, "SUCCESS", timeout=15)  # the poll alone still claims it
