"""Crash-loop quarantine end to end (decision 0165): the real scheduler process and a real runner daemon
run two scheduled workers that fail every attempt, one the same way each time (a segfault), one with
other words each chain; the first is quarantined, shown on Schedules and on its worker's card, and
resumed by one click; the second keeps running. Only the backoff of a waiting retry and the schedules'
next tick are fast-forwarded in the database (the policy itself is unchanged)."""
from __future__ import annotations

import sys
import time

import pytest
from playwright.sync_api import expect
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from scrinalia.scheduler.schedules import create_schedule, get_schedule
from tests.panel.conftest import Proc, RunnerControl, _env
from tests.panel.helpers import ADMIN, login, shot
from tests.panel.panel_workers import WORKERS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CATALOGUE = {w.name: w for w in WORKERS}
#: Words for the flaky worker's chains: a new fingerprint for every chain.
WORDS = ["disk full", "model file missing", "tokenizer refused the input", "socket closed by peer",
         "index out of range", "permission denied", "broken pipe", "unexpected end of stream"]


def _chains_ended(engine, schedule_id: int) -> int:
    """Scheduled chains of the schedule that ended (their last attempt, or a configuration failure)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM archive_worker_runs WHERE schedule_id = :s AND trigger = 'SCHEDULE' "
            "AND status = 'FAILED' AND attempt = 3"), {"s": schedule_id}).scalar_one()


def _fast_forward(engine, flaky_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = now() WHERE status = 'QUEUED' "
                          "AND not_before > now()"))
        conn.execute(text("UPDATE archive_worker_schedules SET next_run_at = now() "
                          "WHERE enabled AND next_run_at > now()"))
        # The flaky worker's next chain fails with other words than every chain started before it (a
        # chain's request is the schedule's at its first attempt; its retries copy it).
        conn.execute(text(
            "UPDATE archive_worker_schedules SET request = jsonb_build_object('options', "
            "  jsonb_build_object('message', (CAST(:words AS text[]))[LEAST(1 + (SELECT count(*) "
            "    FROM archive_worker_runs WHERE schedule_id = :s AND attempt = 1), :n)])) WHERE id = :s"),
            {"words": WORDS, "s": flaky_id, "n": len(WORDS)})


@pytest.fixture
def scheduler_process(panel_database_url):
    proc = Proc("scheduler", [sys.executable, "-m", "scrinalia.cli.main", "scheduler", "run", "--interval", "0.3"],
                _env(panel_database_url, SCHEDULER_QUARANTINE_AFTER="3"))
    yield proc
    assert proc.stop() is not None


@pytest.fixture
def loop_runner(panel_database_url, panel_engine):
    # --listen-poll 0.5: a retry whose backoff the test ends sends no notification; the safety-net poll
    # finds it (a real retry is found the same way, at the default 10 s).
    control = RunnerControl(panel_database_url, name="loop-runner", capabilities="panel-crash,panel-flaky",
                            flags=("--listen-poll", "0.5"))
    control.start()
    control.wait_registered(panel_engine)
    yield control
    control.stop()
    control.remove_socket_dir()


def test_a_crash_loop_is_quarantined_shown_and_resumed(page, panel_engine, loop_runner, scheduler_process):
    crash = create_schedule(panel_engine, "panel-crash", 3600, {"options": {"delay": 0}}, catalogue=CATALOGUE)
    flaky = create_schedule(panel_engine, "panel-flaky", 3600, {"options": {"message": WORDS[0]}},
                            catalogue=CATALOGUE)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert scheduler_process.alive(), scheduler_process.tail()
        assert loop_runner.running, loop_runner.proc.tail() if loop_runner.proc else ""
        quarantined = get_schedule(panel_engine, crash.id).quarantined
        if quarantined and _chains_ended(panel_engine, flaky.id) >= 4:
            break
        _fast_forward(panel_engine, flaky.id)
        time.sleep(0.3)
    else:
        raise AssertionError(f"no quarantine within 150 s:\n{scheduler_process.tail()}")

    stopped = get_schedule(panel_engine, crash.id)
    assert not stopped.enabled and stopped.quarantine_fingerprint
    with panel_engine.connect() as conn:
        history = conn.execute(text(
            "SELECT run_id, attempt, status::text AS status, exit_reason, error_fingerprint FROM archive_worker_runs "
            "WHERE schedule_id = :s ORDER BY id"), {"s": crash.id}).all()
    # Paused at the end of the chain that made three in a row: its last run is the schedule's last run,
    # and the last three chain ends (third attempts, on a machine where no lease was lost: exactly three)
    # failed with the quarantine's fingerprint.
    assert history[-1].run_id == stopped.quarantine_run_id, history
    ends = [r for r in history if r.attempt == 3]
    assert len(ends) >= 3 and all(r.status == "FAILED" and r.error_fingerprint == stopped.quarantine_fingerprint
                                  for r in ends[-3:]), history
    # The flaky worker failed as often, with another fingerprint each chain: never quarantined.
    kept = get_schedule(panel_engine, flaky.id)
    assert kept.enabled and not kept.quarantined
    with panel_engine.connect() as conn:
        fingerprints = conn.execute(text(
            "SELECT count(DISTINCT error_fingerprint) FROM archive_worker_runs WHERE schedule_id = :s AND attempt = 3"),
            {"s": flaky.id}).scalar_one()
    assert fingerprints >= 4
    assert "quarantined" in scheduler_process.tail(200)

    login(page, *ADMIN)
    # The worker's card says its schedule is quarantined, with the fingerprint.
    card = page.locator('article.worker[data-worker="panel-crash"]')
    expect(card).to_have_attribute("data-quarantined", "true")
    expect(card.locator(".quarantine")).to_contain_text("schedule quarantined")
    expect(card.locator(".quarantine")).to_contain_text(stopped.quarantine_fingerprint[:40])
    expect(page.locator('article.worker[data-worker="panel-flaky"]')).to_have_attribute("data-quarantined", "false")
    shot(page, "60-worker-quarantined")
    # /metrics (the ADMIN session reads it) says so too (the page is logged in now).
    scrape = page.request.get("/metrics")
    assert scrape.status == 200
    quarantined = {s.labels["worker"]: s.value for f in text_string_to_metric_families(scrape.text())
                   for s in f.samples if s.name == "scrinalia_schedule_quarantined"}
    assert quarantined == {"panel-crash": 1.0, "panel-flaky": 0.0}


    # The worker's own page says it too, and links to the schedule.
    page.goto("/#/workers/panel-crash")
    note = page.locator(".quarantine")
    expect(note).to_contain_text("schedule quarantined")
    expect(note).to_contain_text(stopped.quarantine_fingerprint[:40])

    # Schedules: the state, the reason and the fingerprint; one click resumes it.
    note.get_by_role("link", name="Resume it on Schedules").click()
    row = page.locator(f'tr[data-schedule="{crash.id}"]')
    expect(row).to_have_attribute("data-state", "quarantined")
    expect(row).to_contain_text("the last 3 retry chains ended FAILED")
    expect(row.locator(".fingerprint")).to_have_text(stopped.quarantine_fingerprint)
    expect(page.locator(f'tr[data-schedule="{flaky.id}"]')).to_have_attribute("data-state", "enabled")
    shot(page, "61-schedule-quarantined")
    with panel_engine.connect() as conn:
        before = conn.execute(text("SELECT max(id) FROM archive_worker_runs WHERE schedule_id = :s"),
                              {"s": crash.id}).scalar_one()
    row.get_by_role("button", name="Resume the panel-crash schedule").click()
    expect(row).to_have_attribute("data-state", "enabled")
    resumed = get_schedule(panel_engine, crash.id)
    assert resumed.enabled and resumed.quarantined_at is None and resumed.quarantine_resumed_by == ADMIN[0]

    # The real scheduler fires the resumed schedule again (its next tick is due).
    with panel_engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_schedules SET enabled = false WHERE id = :s"), {"s": flaky.id})
        conn.execute(text("UPDATE archive_worker_schedules SET next_run_at = now() WHERE id = :s"), {"s": crash.id})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with panel_engine.connect() as conn:
            after = conn.execute(text("SELECT max(id) FROM archive_worker_runs WHERE schedule_id = :s"),
                                 {"s": crash.id}).scalar_one()
        if after > before:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the resumed schedule fired nothing within 30 s:\n{scheduler_process.tail()}")
    with panel_engine.begin() as conn:  # leave the module's database quiet
        conn.execute(text("UPDATE archive_worker_schedules SET enabled = false"))
