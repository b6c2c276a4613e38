"""Issue 28, 2 and 3: an error goes with its cause, and a stopped API is said once.

2. A Run pressed while the API is frozen (SIGSTOP) fails on its card ("did not answer"); once the API is
   back the page clears that error by itself.
3. From the moment the API stops, the bar never claims a calm "refreshing every 60 s"; once stale the
   fact is said once, in one sentence with no nested parentheses; the cards' badges say they are the last
   known state and their buttons are disabled until the API answers again.
"""
from __future__ import annotations

import os
import signal

import pytest
from playwright.sync_api import expect

from scrinalia.db.local_cluster import free_port
from tests.panel.helpers import ADMIN, login, shot
from tests.panel.test_panel import card
from tests.panel.test_staleness import _api

pytestmark = [pytest.mark.browser]

_RECORD = """() => {
  window.__bar = [];
  const el = document.getElementById('refresh-state');
  new MutationObserver(() => window.__bar.push(el.textContent))
    .observe(el, { subtree: true, childList: true, characterData: true });
}"""


def test_an_error_goes_with_its_cause_and_a_stopped_api_is_said_once(browser, panel_database_url, panel_users):
    port = free_port()
    proc = _api(port, panel_database_url)
    context = browser.new_context(base_url=f"http://127.0.0.1:{port}", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        expect(page.locator("body")).to_have_attribute("data-live", "on")
        slow = card(page, "panel-model")
        form_error = slow.locator(".form-error")

        # 2. Frozen: the Run waits for its deadline and fails on the card.
        os.kill(proc.proc.pid, signal.SIGSTOP)
        slow.get_by_role("button", name="Run", exact=True).click()
        expect(form_error).to_contain_text("did not answer", timeout=15_000)
        os.kill(proc.proc.pid, signal.SIGCONT)
        expect(page.locator("#stale-bar")).to_be_hidden(timeout=15_000)
        expect(form_error).to_have_text("", timeout=10_000)
        expect(page.locator("main")).not_to_contain_text("did not answer")
        expect(page.locator("body")).to_have_attribute("data-live", "on")

        # 3. Stopped: what the bar says from the stop on, and the stale page.
        page.evaluate(_RECORD)
        proc.stop()
        expect(page.locator("#stale-bar")).to_be_visible(timeout=10_000)
        said = page.evaluate("window.__bar")
        assert not [t for t in said if "refreshing every" in t], said
        bar = page.locator("#stale-bar").text_content() or ""
        assert bar.startswith("Stale since") and "(" not in bar, bar
        assert bar.count("cannot be reached") == 1, bar
        everything = page.locator("body").inner_text()
        assert everything.count("cannot be reached") == 1, everything  # said once on the whole page
        expect(page.locator("#refresh-state")).not_to_contain_text("Stale since")
        badge = slow.locator(".worker-head .badge")
        expect(badge).to_have_attribute("data-stale", "true")
        assert "last known" in badge.evaluate("el => getComputedStyle(el, '::after').content")
        expect(slow.get_by_role("button", name="Run", exact=True)).to_be_disabled()
        shot(page, "i28-stale-stopped")

        proc = _api(port, panel_database_url)
        expect(page.locator("#stale-bar")).to_be_hidden(timeout=15_000)
        expect(slow.get_by_role("button", name="Run", exact=True)).to_be_enabled()
        expect(badge).not_to_have_attribute("data-stale", "true")
    finally:
        context.close()
        try:
            os.kill(proc.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.stop()
