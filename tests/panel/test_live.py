"""The live panel (decisions 0080, 0081): the ledger's notifications, relayed by the API over one
Server-Sent Events stream per browser, update the page in place; no reload, no focus nudge.

With the stream up the panel's safety poll is 30 s (60 s when idle), so a change that shows within a
few seconds here can only have come through the stream. The deadlines below are that bound, not a
latency target (bench/bench_live.py measures the latency); the test prints what it saw against the
database's own timestamps.
"""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from playwright.sync_api import expect
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from tests.panel.conftest import _env
from tests.panel.helpers import ADMIN, REPO, login, shot
from tests.panel.test_panel import card, enqueue_from_card, ensure_idle, wait_db

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LIVE_BOUND_MS = 5_000  # well under the 30 s safety poll: only the stream can explain it

TRAIL = """(worker) => {
  window.__noReload = true;
  window.__trail = [];
  const card = document.querySelector(`article[data-worker="${worker}"]`);
  const record = () => {
    const bar = card.querySelector('[role=progressbar]');
    const last = window.__trail[window.__trail.length - 1];
    const now = { t: Date.now(), state: card.dataset.state, done: bar ? bar.getAttribute('aria-valuenow') : null };
    if (!last || last.state !== now.state || last.done !== now.done) window.__trail.push(now);
  };
  new MutationObserver(record).observe(card, { subtree: true, attributes: true, childList: true });
  record();
}"""


def _api_events_backends(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'scrinalia-api-events' "
            "AND datname = current_database()")).scalar_one()


def _wait_serving(engine: Engine, name: str, timeout: float = 90) -> None:
    """The runner's loop runs (its first heartbeat came after its fork server was ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(text(
                "SELECT count(*) FROM archive_worker_runners WHERE name = :n AND stopped_at IS NULL "
                "AND last_heartbeat_at > started_at"), {"n": name}).scalar_one():
                return
        time.sleep(0.2)
    raise AssertionError(f"the runner {name} does not serve within {timeout} s")


def _read_events(lines, want, timeout: float = 20.0) -> list[tuple[str, str]]:
    """(event, data) pairs off an SSE response's line iterator until ``want(pairs)`` holds (the stream's
    3 s heartbeat bounds each read)."""
    pairs: list[tuple[str, str]] = []
    event = None
    deadline = time.monotonic() + timeout
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: ") and event:
            pairs.append((event, line[len("data: "):]))
            event = None
            if want(pairs):
                return pairs
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"not seen within {timeout} s: {pairs}")


def test_the_event_stream_needs_a_session_and_shares_one_listen_connection(live_api, panel_users, panel_engine):
    with httpx.Client(base_url=live_api, timeout=20) as anon:
        assert anon.get("/api/v1/system/events").status_code == 401
    with httpx.Client(base_url=live_api, timeout=20) as client:
        r = client.post("/api/v1/auth/login", json={"email": ADMIN[0], "password": ADMIN[1]})
        assert r.status_code == 200, r.text
        with client.stream("GET", "/api/v1/system/events") as first, \
                client.stream("GET", "/api/v1/system/events") as second:
            assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
            streams = [first.iter_lines(), second.iter_lines()]
            for lines in streams:
                # hello, then (when the hub was not listening yet) the resync that says it is now.
                _read_events(lines, lambda p: p and ((p[0][0] == "hello" and '"listening":true' in p[0][1])
                                                      or p[-1][0] == "resync"))
            ensure_idle(panel_engine, "panel-crash")
            run = ledger.enqueue(panel_engine, "panel-crash", {}, trigger="SCHEDULE")
            for lines in streams:
                pairs = _read_events(lines, lambda p: any(str(run.run_id) in d for _, d in p))
                assert any(e == "run" and '"status":"QUEUED"' in d for e, d in pairs), pairs
            # Two browsers, one LISTEN connection in the API process.
            assert _api_events_backends(panel_engine) == 1
            ledger.request_cancel(panel_engine, run.run_id, "test")


def test_an_idle_page_shows_runs_enqueued_elsewhere(page, panel_engine, runner_control, panel_database_url):
    runner_control.stop()
    ensure_idle(panel_engine, "panel-crash")
    ensure_idle(panel_engine, "panel-slow")
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    expect(page.locator("#refresh-state")).to_contain_text("Live")
    crash = card(page, "panel-crash")
    expect(crash).to_have_attribute("data-state", "idle")
    page.evaluate(TRAIL, "panel-crash")

    # What the scheduler does: a direct ledger enqueue, from another process' point of view.
    run = ledger.enqueue(panel_engine, "panel-crash", {}, trigger="SCHEDULE")
    expect(crash).to_have_attribute("data-state", "queued", timeout=LIVE_BOUND_MS)
    expect(crash.locator(".active")).to_contain_text("· schedule ·")  # the trigger in words (issue 28, 7)
    shot(page, "live-01-enqueued-elsewhere")
    ledger.request_cancel(panel_engine, run.run_id, "test")
    expect(crash).not_to_have_attribute("data-state", "queued", timeout=LIVE_BOUND_MS)

    # "38 s ago" does not stand still: the relative times tick by themselves.
    stamp = crash.locator(".facts time[data-ago]").first
    before = stamp.text_content()
    expect(stamp).not_to_have_text(before, timeout=15_000)
    assert page.evaluate("window.__noReload") is True

    # A run started by the one-shot CLI (its own RUNNING row, no daemon involved) shows up too.
    slow = card(page, "panel-slow")
    cli = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", "panel-slow", "--option", "units=6", "--option", "delay=0.6"],
        cwd=REPO, env=_env(panel_database_url), capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    expect(slow.locator(".facts")).to_contain_text("command line", timeout=LIVE_BOUND_MS)
    assert page.evaluate("window.__noReload") is True


def test_press_run_and_watch_it_live(page, panel_engine, runner_control, panel_database_url):
    ensure_idle(panel_engine, "panel-slow")
    runner_control.start()
    runner_control.wait_registered(panel_engine)
    _wait_serving(panel_engine, runner_control.name)
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    slow = card(page, "panel-slow")
    expect(slow).to_have_attribute("data-state", "idle")
    page.evaluate(TRAIL, "panel-slow")

    enqueue_from_card(page, "panel-slow", units=20, delay=0.5)  # 10 batches of 2: about 5 s
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
    expect(slow).to_have_attribute("data-state", "running", timeout=LIVE_BOUND_MS)
    bar = slow.get_by_role("progressbar")
    expect(bar).to_have_attribute("aria-valuemax", "20", timeout=LIVE_BOUND_MS)
    shot(page, "live-02-running")
    expect(slow).to_have_attribute("data-state", "idle", timeout=30_000)
    expect(slow.locator(".facts")).to_contain_text("SUCCESS")
    run = wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "SUCCESS", 5, "SUCCESS")

    trail = page.evaluate("window.__trail")
    states = [s["state"] for s in trail]
    assert "running" in states and states[-1] == "idle", trail
    progress = {s["done"] for s in trail if s["state"] == "running" and s["done"] is not None}
    assert len(progress) >= 2, f"the progress did not move on the page: {trail}"
    assert page.evaluate("window.__noReload") is True  # all of it without a reload

    # For the record (not asserted): the page against the database's timestamps (one host, one clock).
    with panel_engine.connect() as conn:
        row = conn.execute(text(
            "SELECT extract(epoch FROM started_at) * 1000 AS started, extract(epoch FROM finished_at) * 1000 "
            "AS finished FROM archive_worker_runs WHERE run_id = :r"), {"r": run["run_id"]}).one()
    seen_running = next(s["t"] for s in trail if s["state"] == "running")
    seen_done = next(s["t"] for s in trail if s["state"] == "idle" and s["t"] > seen_running)
    print(f"\nlive panel: RUNNING shown {seen_running - float(row.started):.0f} ms after the claim, "
          f"SUCCESS shown {seen_done - float(row.finished):.0f} ms after the finish; "
          f"{len(progress)} progress values seen")


def test_an_open_stream_does_not_hold_up_the_api_shutdown(panel_database_url, panel_users):
    """Uvicorn waits for open responses before it exits; the hub ends its streams on SIGTERM first."""
    import signal as signals

    from scrinalia.cli.dev import wait_http
    from scrinalia.db.local_cluster import free_port
    from tests.panel.conftest import Proc

    port = free_port()
    proc = Proc("api-shutdown", [sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
                                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                _env(panel_database_url))
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_http(f"{base}/healthz", 60, alive=proc.alive), proc.tail()
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.post("/api/v1/auth/login", json={"email": ADMIN[0], "password": ADMIN[1]}).status_code == 200
            with client.stream("GET", "/api/v1/system/events") as stream:
                lines = stream.iter_lines()
                _read_events(lines, lambda p: p and p[0][0] == "hello")
                proc.proc.send_signal(signals.SIGTERM)
                rest, deadline = [], time.monotonic() + 20
                for line in lines:  # the server ends the stream; without the hook only heartbeats come
                    rest.append(line)
                    assert time.monotonic() < deadline, f"the stream outlived the shutdown: {rest}"
        assert all(not line.startswith("event: run") for line in rest)
        assert proc.proc.wait(30) in (0, -signals.SIGTERM), proc.tail()  # uvicorn re-raises the signal
    finally:
        proc.stop()
