"""Accessibility of the panel (issue 28): axe-core (vendored under tests/panel/axe/, the npm package's
unmodified axe.min.js) on every page and state (idle, running, failed, stale, quarantined) at 1280 and
390 px (and ten of those states in the dark palette at 1280 px) reports no serious or critical
violation of WCAG 2.1 A/AA or axe's best practices; a keyboard-only walk performs Run, Cancel, Retry,
Resume and a settings change, with a visible focus at each step.

axe is injected into a context that bypasses the page's Content-Security-Policy (axe is test code, not
the panel's); every other panel test walks the pages under the policy.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from tests.panel.helpers import ADMIN, login, shot
from tests.panel.test_live import _wait_serving
from tests.panel.test_panel import card, ensure_idle, wait_db

pytestmark = [pytest.mark.browser]

AXE = (Path(__file__).parent / "axe" / "axe.min.js").read_text()
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
WIDTHS = [1280, 390]
DARK = {"login", "workers-idle-quarantined", "worker-trend", "run-failed", "schedules-quarantined",
        "settings-needs-a-model", "workers-running", "run-running", "runners-running", "workers-stale"}
SHOTS = {"workers-idle-quarantined", "run-running", "workers-stale"}


def axe_problems(page: Page) -> list[str]:
    """axe's serious and critical violations on the page as it stands, one line each."""
    if not page.evaluate("Boolean(window.axe)"):
        page.evaluate(AXE)
    result = page.evaluate("(tags) => axe.run(document, { runOnly: { type: 'tag', values: tags } })", TAGS)
    return [f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes'][:3]]}"
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


_COLOUR_ALONE = """() => {
  const out = [];
  // a state badge says its state in words; a dot (colour only) has words beside it; a chart has a legend
  for (const b of document.querySelectorAll('.badge')) {
    if (!b.textContent.trim()) out.push(`empty badge: ${b.className}`);
  }
  for (const d of document.querySelectorAll('.dot')) if (!d.parentElement.textContent.trim()) out.push('a dot alone');
  for (const f of document.querySelectorAll('figure.chart')) {
    const drawn = f.chart && f.chart.uplot;
    if (drawn && !f.querySelector('.u-legend')) out.push(`a chart without a legend: ${f.dataset.chart}`);
  }
  return out;
}"""


def colour_alone(page: Page) -> list[str]:
    """Colour never the only carrier: each badge, dot and chart has its words."""
    return page.evaluate(_COLOUR_ALONE)


def _seed(engine: Engine) -> dict[str, str]:
    """A failed run (with an error), a succeeded one, and a quarantined schedule whose run failed."""
    ids: dict[str, str] = {}
    for key, status, error in (("failed", "FAILED", "RuntimeError: seeded failure in model_dir 3"),
                               ("success", "SUCCESS", None)):
        run = ledger.enqueue(engine, "panel-flaky", {}, trigger="API", requested_by="seed")
        with engine.begin() as conn:
            conn.execute(text(
                f"UPDATE archive_worker_runs SET status = '{status}', "
                "started_at = now() - interval '1 minute', finished_at = now(), duration_ms = 60000, error = :e, "
                "exit_reason = CASE WHEN CAST(:e AS text) IS NULL THEN NULL ELSE 'exception' END, "
                "progress = '{\"done\": 1, \"total\": 1, \"unit\": \"item\"}' WHERE run_id = :r"),
                {"e": error, "r": run.run_id})
        ids[key] = str(run.run_id)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_worker_schedules"))
        fingerprint = conn.execute(text("SELECT error_fingerprint FROM archive_worker_runs WHERE run_id = :r"),
                                   {"r": ids["failed"]}).scalar_one()
        conn.execute(text(
            "INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at, enabled, "
            "last_tick_at, last_run_id, last_outcome, quarantined_at, quarantine_reason, quarantine_fingerprint, "
            "quarantine_run_id) VALUES ('panel-flaky', 300, '{}', now(), false, now(), :r, 'enqueued', now(), "
            "'3 retry chains in a row ended FAILED with one error', :f, :r)"), {"r": ids["failed"], "f": fingerprint})
    return ids


@pytest.fixture(scope="module")
def seeded(panel_engine: Engine, panel_users) -> dict[str, str]:
    return _seed(panel_engine)


def _context(browser, live_api: str, width: int):
    return browser.new_context(base_url=live_api, viewport={"width": width, "height": 900}, bypass_csp=True,
                               color_scheme="light", reduced_motion="reduce")


@pytest.mark.parametrize("width", WIDTHS)
def test_axe_finds_nothing_serious_on_any_page_or_state(browser, live_api, panel_engine, seeded, runner_control,
                                                        width):
    context = _context(browser, live_api, width)
    page = context.new_page()
    page.set_default_timeout(15_000)
    found: dict[str, list[str]] = {}

    def check(state: str) -> None:
        found[state] = axe_problems(page) + colour_alone(page)
        if state in SHOTS:
            shot(page, f"a11y-{width}-{state}", full_page=False)
        if width != 1280 or state not in DARK:
            return
        # The same state in the dark palette (prefers-color-scheme: dark), then back: at one width and on
        # the states that hold every kind of element (the palette does not change with the width or the
        # page; the test's time does).
        page.emulate_media(color_scheme="dark")
        found[f"{state} (dark)"] = axe_problems(page)
        page.emulate_media(color_scheme="light")

    try:
        page.goto("/")
        expect(page.get_by_role("button", name="Log in")).to_be_visible()
        check("login")
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        expect(card(page, "panel-flaky").locator(".quarantine")).to_be_visible()
        check("workers-idle-quarantined")
        page.locator("details.run-options summary").first.click()
        check("workers-run-options-open")
        for url, heading, state in (
            ("/#/workers/panel-flaky", "Flaky worker (test)", "worker-trend"),
            ("/#/runs", "Runs", "runs"),
            (f"/#/runs/{seeded['failed']}", re.compile(r"^Run "), "run-failed"),
            (f"/#/runs/{seeded['success']}", re.compile(r"^Run "), "run-success"),
            ("/#/failures", "Failures", "failures"),
            ("/#/runners", "Runners", "runners-idle"),
            ("/#/schedules", "Schedules", "schedules-quarantined"),
            ("/#/workers/panel-slow/settings", re.compile("^Settings"), "settings"),
            ("/#/workers/panel-model/settings", re.compile("^Settings"), "settings-needs-a-model"),
        ):
            page.goto(url)
            expect(page.get_by_role("heading", name=heading, level=1)).to_be_visible()
            page.wait_for_load_state("networkidle") if state.startswith("run-") else None
            expect(page.locator("#refresh-state")).not_to_have_text("")
            check(state)
        # Running: a long run of the slow worker, on the workers page, its run page and the runners page.
        ensure_idle(panel_engine, "panel-slow")
        runner_control.start()
        runner_control.wait_registered(panel_engine)
        _wait_serving(panel_engine, runner_control.name)
        run = ledger.enqueue(panel_engine, "panel-slow", {"options": {"units": 400, "delay": 0.3}})
        wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING" and (r["progress"] or {}).get("done"),
                30, "RUNNING with progress")
        page.goto("/#/workers")
        expect(card(page, "panel-slow")).to_have_attribute("data-state", "running")
        check("workers-running")
        page.goto(f"/#/runs/{run.run_id}")
        page.wait_for_function("() => { const f = document.querySelector('figure[data-chart=\"run\"]');"
                               " return f && f.chart.uplot; }", timeout=20_000)
        check("run-running")
        page.goto("/#/runners")
        expect(page.locator(f'article[data-runner="{runner_control.name}"] table.stack tbody tr')).to_have_count(1)
        check("runners-running")
        # Stale: the API does not answer (the browser's requests fail), the page says so.
        page.goto("/#/workers")
        expect(card(page, "panel-slow")).to_have_attribute("data-state", "running")
        page.route("**/api/v1/**", lambda route: route.abort())
        page.locator("#refresh-now").click()
        expect(page.locator("#stale-bar")).to_be_visible()
        check("workers-stale")
        page.unroute("**/api/v1/**")
        ledger.request_cancel(panel_engine, run.run_id, "a11y test")
        wait_db(panel_engine, "panel-slow", lambda r: r["status"] not in ("QUEUED", "RUNNING"), 30, "ended")
    finally:
        context.close()
    problems = {k: v for k, v in found.items() if v}
    assert not problems, json.dumps(problems, indent=1)


_FOCUS = """() => {
  const a = document.activeElement;
  const s = getComputedStyle(a);
  const label = a.getAttribute('aria-label') || (a.labels && a.labels[0] ? a.labels[0].textContent : a.textContent);
  return { tag: a.tagName, text: (label || '').trim().slice(0, 60), visible: a.matches(':focus-visible'),
           outline: s.outlineStyle, width: parseFloat(s.outlineWidth) };
}"""


def _focus_visible(page: Page) -> dict:
    return page.evaluate(_FOCUS)


def tab_to(page: Page, name: str | re.Pattern[str], *, limit: int = 250, back: bool = False) -> dict:
    """Press Tab (Shift+Tab with ``back``) until the focused control's name matches ``name``; its focus must
    be visible (a 2 px outline at least)."""
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if back else "Tab")
        f = _focus_visible(page)
        if (name.search(f["text"]) if isinstance(name, re.Pattern) else f["text"] == name):
            assert f["visible"] and f["outline"] != "none" and f["width"] >= 2, f
            return f
    raise AssertionError(f"{name!r} not reached with the keyboard in {limit} steps")


def test_a_keyboard_alone_runs_cancels_retries_resumes_and_changes_a_setting(browser, live_api, panel_engine,
                                                                              seeded, runner_control):
    ensure_idle(panel_engine, "panel-slow")
    runner_control.start()
    runner_control.wait_registered(panel_engine)
    _wait_serving(panel_engine, runner_control.name)
    context = _context(browser, live_api, 1280)
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        page.goto("/")
        expect(page.get_by_role("button", name="Log in")).to_be_visible()
        tab_to(page, "E-mail")
        page.keyboard.type(ADMIN[0])
        page.keyboard.press("Tab")
        page.keyboard.type(ADMIN[1])
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()

        # Run: open the slow worker's options, ask for a long run, press Run.
        slow = card(page, "panel-slow")
        tab_to(page, "Settings of Slow batches (test)")  # the slow worker's card
        tab_to(page, "Options")
        page.keyboard.press("Enter")
        tab_to(page, "Units")
        page.keyboard.type("400")
        tab_to(page, "Run")
        page.keyboard.press("Enter")
        run = wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
        shot(page, "kbd-01-run")

        # Cancel: its button, then the confirmation, which takes the focus.
        expect(slow.get_by_role("button", name=re.compile(r"^Cancel run"))).to_be_visible()
        tab_to(page, re.compile(r"^Cancel run"))
        page.keyboard.press("Enter")
        expect(page.get_by_role("button", name="Yes, cancel it")).to_be_focused()  # the dialog opens, then focuses
        f = _focus_visible(page)
        assert f["text"] == "Yes, cancel it" and f["visible"], f
        # A refresh rebuilds the card under the focus (the run's progress moves on): the focus stays on the
        # rebuilt confirmation instead of falling to the page's body (a CI run lost it this way).
        page.evaluate("document.activeElement.dataset.beforeRefresh = 'yes'")
        page.evaluate("window.dispatchEvent(new Event('focus'))")  # the panel refreshes on focus
        expect(page.locator("[data-before-refresh]")).to_have_count(0)
        expect(page.get_by_role("button", name="Yes, cancel it")).to_be_focused()
        page.keyboard.press("Enter")
        wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "CANCELLED", 30, "CANCELLED")
        shot(page, "kbd-02-cancel")

        # Retry: the failed run's page, its Retry button.
        page.goto(f"/#/runs/{seeded['failed']}")
        expect(page.get_by_role("button", name="Retry")).to_be_visible()
        tab_to(page, "Retry")
        page.keyboard.press("Enter")
        expect(page).not_to_have_url(re.compile(seeded["failed"]))
        with panel_engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE retry_of = :r"),
                                {"r": seeded["failed"]}).scalar_one() == 1
        shot(page, "kbd-03-retry")

        # Resume: the quarantined schedule.
        page.goto("/#/schedules")
        expect(page.get_by_role("button", name="Resume the panel-flaky schedule")).to_be_visible()
        tab_to(page, "Resume the panel-flaky schedule")
        page.keyboard.press("Enter")
        expect(page.locator('tr[data-worker="panel-flaky"]')).to_have_attribute("data-state", "enabled")
        shot(page, "kbd-04-resume")

        # A settings change: the slow worker's delay, saved with Enter on the button.
        page.goto("/#/workers/panel-slow/settings")
        expect(page.get_by_role("button", name="Save settings")).to_be_visible()
        tab_to(page, "Delay")
        page.keyboard.type("0.25")
        tab_to(page, "Save settings")
        page.keyboard.press("Enter")
        expect(page.get_by_role("status").filter(has_text=re.compile(r"Saved: revision \d+"))).to_be_visible()
        with panel_engine.connect() as conn:
            saved = conn.execute(text("SELECT options FROM archive_worker_settings WHERE worker_name = 'panel-slow' "
                                      "ORDER BY revision DESC LIMIT 1")).scalar_one()
        assert saved["delay"] == 0.25, saved
        shot(page, "kbd-05-settings")
        assert run["status"] == "RUNNING"
    finally:
        context.close()
        with panel_engine.begin() as conn:
            conn.execute(text("DELETE FROM archive_worker_settings WHERE worker_name = 'panel-slow'"))
