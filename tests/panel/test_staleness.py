"""The page never lies about being live (decision 0144): with the API frozen (SIGSTOP) or stopped, an open
page says "Stale since ..." within 10 s, and by itself it is live again within 5 s of the API's return.

A frozen API keeps its sockets open and answers nothing: only the stream's heartbeat (an event every
3 s; silent for two of them and a second, the stream is down) and the requests' deadline can tell.
"Refresh now" shows that it is trying while its request waits on the frozen API.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from playwright.sync_api import expect

from scrinalia.cli.dev import wait_http
from scrinalia.db.local_cluster import free_port
from tests.panel.conftest import Proc, _env
from tests.panel.helpers import ADMIN, CHROMIUM_ARGS, login, shot

pytestmark = [pytest.mark.browser]

STALE_WITHIN_S = 10.0
BACK_WITHIN_S = 5.0


def _api(port: int, database_url: str) -> Proc:
    proc = Proc("api-stale", [sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
                              "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                _env(database_url))
    assert wait_http(f"http://127.0.0.1:{port}/healthz", 60, alive=proc.alive), proc.tail()
    return proc


def _seconds_until(page, selector: str, condition: str, limit: float) -> float:
    """Seconds until ``condition`` (a JS expression over ``el``) holds for ``selector``, polled by the page."""
    started = time.monotonic()
    page.wait_for_function(f"() => {{ const el = document.querySelector({selector!r}); return {condition}; }}",
                           timeout=limit * 1000 + 2000, polling=100)
    return time.monotonic() - started


def test_a_frozen_or_stopped_api_is_shown_stale_and_the_page_recovers(browser, panel_database_url, panel_users):
    port = free_port()
    proc = _api(port, panel_database_url)
    context = browser.new_context(base_url=f"http://127.0.0.1:{port}", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    assert "--no-sandbox" in CHROMIUM_ARGS
    seen: dict[str, float] = {}
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        expect(page.locator("body")).to_have_attribute("data-live", "on")
        expect(page.locator("#stale-bar")).to_be_hidden()

        # Frozen: the process is stopped, its sockets stay open.
        os.kill(proc.proc.pid, signal.SIGSTOP)
        seen["frozen: stale shown after"] = _seconds_until(
            page, "#stale-bar", "!el.hidden && el.textContent.startsWith('Stale since')", STALE_WITHIN_S)
        expect(page.locator("body")).to_have_attribute("data-live", "off")
        expect(page.locator("#refresh-state")).not_to_contain_text("Live")
        shot(page, "40-stale-frozen")
        page.locator("#refresh-now").click()
        # Its request waits on the frozen API: the button says so until the deadline.
        expect(page.locator("#refresh-now")).to_have_attribute("aria-busy", "true")
        expect(page.locator("#refresh-now")).to_have_text("Refreshing…")
        expect(page.locator("#refresh-state")).to_contain_text("Trying to reach the API")
        shot(page, "41-refresh-trying")
        os.kill(proc.proc.pid, signal.SIGCONT)
        seen["thawed: stale gone after"] = _seconds_until(page, "#stale-bar", "el.hidden", BACK_WITHIN_S)
        expect(page.locator("body")).to_have_attribute("data-live", "on")

        # Stopped: the process is gone (connections refused), then started again on the same port.
        proc.stop()
        seen["stopped: stale shown after"] = _seconds_until(
            page, "#stale-bar", "!el.hidden && el.textContent.startsWith('Stale since')", STALE_WITHIN_S)
        shot(page, "42-stale-stopped")
        proc = _api(port, panel_database_url)
        seen["restarted: stale gone after"] = _seconds_until(page, "#stale-bar", "el.hidden", BACK_WITHIN_S)
        expect(page.locator("body")).to_have_attribute("data-live", "on")
        expect(page.locator("#refresh-now")).to_have_text("Refresh now")
    finally:
        print({k: round(v, 1) for k, v in seen.items()})
        context.close()
        try:
            os.kill(proc.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.stop()
    assert seen["frozen: stale shown after"] < STALE_WITHIN_S and seen["stopped: stale shown after"] < STALE_WITHIN_S
    assert seen["thawed: stale gone after"] < BACK_WITHIN_S and seen["restarted: stale gone after"] < BACK_WITHIN_S
