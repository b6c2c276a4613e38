"""The operations panel in headless chromium, against a live API, a real PostgreSQL and a real runner.

Each test saves screenshots under ``test-artifacts/panel/``. Where a test must not wait for a 15 s
poll it dispatches a window ``focus`` event: that is the ADR's "resume on focus" path, what happens
when an operator comes back to the tab.
"""
from __future__ import annotations

import re
import time
import uuid

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text

from scrinalia.domains.archive.run_ids import short_id
from tests.panel.helpers import ADMIN, VIEWER, login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


# --- helpers ---------------------------------------------------------------------------------------


def last_run(engine: Engine, worker: str) -> dict | None:
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT run_id, status, progress, exit_signal, error_fingerprint FROM archive_worker_runs "
            "WHERE worker_name = :w ORDER BY id DESC LIMIT 1"
        ), {"w": worker}).mappings().first()
    return dict(row) if row else None


def wait_db(engine: Engine, worker: str, predicate, timeout: float = 30, what: str = "") -> dict:
    deadline = time.monotonic() + timeout
    run = None
    while time.monotonic() < deadline:
        run = last_run(engine, worker)
        if run is not None and predicate(run):
            return run
        time.sleep(0.1)
    raise AssertionError(f"{worker}: {what or 'condition'} not reached within {timeout} s; last run: {run}")


def nudge(page) -> None:
    """The operator comes back to the window: the panel refreshes at once (ADR: resume on focus)."""
    page.evaluate("window.dispatchEvent(new Event('focus'))")


def card(page, worker: str):
    return page.locator(f'article[data-worker="{worker}"]')


def enqueue_from_card(page, worker: str, **options) -> None:
    c = card(page, worker)
    if options:
        details = c.locator("details.run-options")
        if details.get_attribute("open") is None:
            c.get_by_text("Options", exact=True).click()
        for name, value in options.items():
            c.get_by_label(name[0].upper() + name[1:].replace("_", " "), exact=True).fill(str(value))
    c.get_by_role("button", name="Run", exact=True).click()


def ensure_idle(engine: Engine, worker: str) -> None:
    """Cancel whatever a previous test left active on ``worker`` and wait until it ended."""
    from scrinalia.domains.archive import ledger

    run = last_run(engine, worker)
    if run and run["status"] in ("QUEUED", "RUNNING"):
        ledger.request_cancel(engine, run["run_id"], "test cleanup")
        wait_db(engine, worker, lambda r: r["status"] not in ("QUEUED", "RUNNING"), 30, "cleanup")


@pytest.fixture
def running_runner(runner_control, panel_engine):
    runner_control.start()
    runner_control.wait_registered(panel_engine)
    return runner_control


# --- the tests -------------------------------------------------------------------------------------


def test_login_forces_a_password_change_and_shows_the_user(page, panel_engine):
    from scrinalia.domains.identity import users

    email = f"first-{uuid.uuid4().hex[:6]}@panel.test"
    users.create_user(panel_engine, email, "initial-password-1", "ADMIN", must_change_password=True)

    page.goto("/")
    expect(page).to_have_url(re.compile(r"#/login$"))
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    shot(page, "01-login")

    # A wrong password says so, beside the form, and keeps us on the page.
    login(page, email, "not-the-password")
    expect(page.get_by_role("alert")).to_contain_text("wrong")

    login(page, email, "initial-password-1")
    expect(page).to_have_url(re.compile(r"#/password$"))
    expect(page.get_by_role("heading", name="Choose your password")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_hidden()
    # Any other page sends us back here until the password is changed.
    page.goto("/#/workers")
    expect(page).to_have_url(re.compile(r"#/password$"))

    page.get_by_label("Current password").fill("initial-password-1")
    page.get_by_label("New password", exact=True).fill("short")
    page.get_by_label("Repeat the new password").fill("short")
    page.get_by_role("button", name="Change password").click()
    expect(page.locator('[data-error-for="new_password"]')).to_contain_text("12 characters")
    shot(page, "02-password-change")

    page.get_by_label("New password", exact=True).fill("my-own-password-42")
    page.get_by_label("Repeat the new password").fill("my-own-password-42")
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    header = page.locator("#who")
    expect(header).to_contain_text(email)
    expect(header).to_contain_text("ADMIN")
    with panel_engine.connect() as conn:
        assert conn.execute(text("SELECT must_change_password FROM auth_users WHERE email = :e"),
                            {"e": email}).scalar_one() is False

    header.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"#/login$"))
    page.goto("/#/workers")
    expect(page).to_have_url(re.compile(r"#/login$"))


def test_a_run_goes_queued_running_success(page: Page, panel_engine, runner_control):
    runner_control.stop()  # no runner yet: the run must wait, and the panel must say why
    ensure_idle(panel_engine, "panel-slow")
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    slow = card(page, "panel-slow")
    expect(slow).to_have_attribute("data-state", re.compile("idle|failed"))

    # Client-side validation: a bad batch size and option never reach the API.
    slow.get_by_text("Options", exact=True).click()
    slow.get_by_label("Database batch").fill("0")
    slow.get_by_label("Units", exact=True).fill("2.5")
    slow.get_by_role("button", name="Run", exact=True).click()
    expect(slow.locator('[data-error-for="db_batch_size"]')).to_contain_text("whole number")
    expect(slow.locator('[data-error-for="options.units"]')).to_contain_text("whole number")
    assert last_run(panel_engine, "panel-slow") is None
    slow.get_by_label("Database batch").fill("")
    slow.get_by_label("Units", exact=True).fill("")
    slow.get_by_label("Delay", exact=True).fill("99")
    slow.get_by_role("button", name="Run", exact=True).click()
    expect(slow.locator('[data-error-for="options.delay"]')).to_contain_text("60")
    assert last_run(panel_engine, "panel-slow") is None
    # The API's own 422 lands beside its field too: a form older than the catalogue offers an engine
    # that the API no longer knows.
    emb = card(page, "embedding")
    emb.get_by_text("Options", exact=True).click()
    emb.get_by_label("Engine").evaluate(
        "sel => { sel.append(new Option('retired-engine', 'retired-engine')); sel.value = 'retired-engine'; }")
    emb.get_by_role("button", name="Run", exact=True).click()
    expect(emb.locator('[data-error-for="engine_name"]')).to_contain_text("retired-engine")
    assert last_run(panel_engine, "embedding") is None
    shot(page, "03-run-form-errors")

    slow.get_by_label("Delay", exact=True).fill("0.6")
    slow.get_by_label("Units", exact=True).fill("40")  # 20 batches of 2 items: about 12 s
    slow.get_by_role("button", name="Run", exact=True).click()
    expect(slow).to_have_attribute("data-state", "queued")
    expect(slow.locator(".queued-reason")).to_contain_text("no online runner")
    expect(page.locator("body")).to_have_attribute("data-poll", "queued")
    expect(page.locator("#refresh-state")).to_contain_text("Live")  # the stream; the poll is the fallback
    shot(page, "04-workers-queued")

    runner_control.start()
    runner_control.wait_registered(panel_engine)
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 60, "RUNNING")
    nudge(page)
    expect(slow).to_have_attribute("data-state", "running", timeout=10_000)
    expect(page.locator("body")).to_have_attribute("data-poll", "running")
    bar = slow.get_by_role("progressbar")
    expect(bar).to_be_visible()
    expect(bar).to_have_attribute("aria-valuemax", "40", timeout=12_000)  # the first heartbeat's progress
    first = int(bar.get_attribute("aria-valuenow") or 0)
    # The 5 s poll moves the bar on by itself (no nudge).
    expect(bar).not_to_have_attribute("aria-valuenow", str(first), timeout=12_000)
    expect(slow.locator(".progress-text")).to_contain_text("of 40 items")
    expect(slow.locator(".progress-text")).to_contain_text("left")  # the ETA
    shot(page, "05-workers-running")

    expect(slow).to_have_attribute("data-state", "idle", timeout=30_000)
    expect(slow.locator(".facts")).to_contain_text("SUCCESS")
    expect(page.locator("body")).to_have_attribute("data-poll", "idle")
    run = last_run(panel_engine, "panel-slow")
    assert run["status"] == "SUCCESS"

    # The run's page: the request beside the effective configuration, timings, metrics.
    slow.locator(".facts a").first.click()
    expect(page.get_by_role("heading", name=re.compile(r"^Run "))).to_be_visible()
    expect(page.locator(".compare")).to_contain_text("Requested")
    expect(page.locator(".compare")).to_contain_text("40")
    expect(page.get_by_role("heading", name="Timings")).to_be_visible()
    expect(page.get_by_role("heading", name="Metrics")).to_be_visible()
    shot(page, "06-run-detail-success")

    page.goto("/#/runs")
    expect(page.locator(f'tr[data-run-id="{run["run_id"]}"]')).to_contain_text("SUCCESS")
    shot(page, "07-runs")


def test_cancel_a_running_run(page, panel_engine, running_runner):
    ensure_idle(panel_engine, "panel-slow")
    login(page, *ADMIN)
    enqueue_from_card(page, "panel-slow", units=400, delay=0.4)
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
    nudge(page)
    slow = card(page, "panel-slow")
    expect(slow).to_have_attribute("data-state", "running")

    slow.get_by_role("button", name=re.compile("^Cancel run")).click()
    slow.get_by_role("button", name="Yes, cancel it").click()
    run = wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "CANCELLED", 20, "CANCELLED")
    expect(slow).to_have_attribute("data-state", "idle", timeout=12_000)
    expect(slow.locator(".facts")).to_contain_text("CANCELLED")
    shot(page, "08-workers-cancelled")

    page.goto(f"/#/runs/{run['run_id']}")
    expect(page.locator("main")).to_contain_text("CANCELLED")
    expect(page.locator("main")).to_contain_text("cancelled at a batch boundary")
    shot(page, "09-run-detail-cancelled")


def test_a_crashed_run_shows_under_failures(page, panel_engine, running_runner):
    login(page, *ADMIN)
    enqueue_from_card(page, "panel-crash")
    run = wait_db(panel_engine, "panel-crash", lambda r: r["status"] == "FAILED", 30, "FAILED")
    assert run["error_fingerprint"]
    nudge(page)
    crash = card(page, "panel-crash")
    expect(crash).to_have_attribute("data-state", "failed")
    expect(crash.locator(".badge").first).to_have_text("Failed last time")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Failures").click()
    group = page.locator(f'tr[data-fingerprint="{run["error_fingerprint"]}"]')
    expect(group).to_contain_text("panel-crash")
    shot(page, "10-failures")

    group.get_by_role("link").first.click()
    expect(page).to_have_url(re.compile(r"#/runs\?fingerprint="))
    expect(page.get_by_label("Fingerprint")).to_have_value(run["error_fingerprint"])
    rows = page.locator("tbody tr[data-run-id]")
    expect(rows.first).to_contain_text("FAILED")
    for status in rows.evaluate_all("rows => rows.map(r => r.dataset.status)"):
        assert status == "FAILED"
    shot(page, "11-runs-by-fingerprint")

    page.locator(f'tr[data-run-id="{run["run_id"]}"] a').first.click()
    exit_card = page.locator("section", has=page.get_by_role("heading", name="Exit"))
    expect(exit_card).to_contain_text("SIGSEGV")
    expect(exit_card).to_contain_text("panel-crash")
    shot(page, "12-run-detail-crash")


def test_a_runner_shows_its_children(page, panel_engine, running_runner):
    ensure_idle(panel_engine, "panel-slow")
    login(page, *ADMIN)
    enqueue_from_card(page, "panel-slow", units=400, delay=0.4)
    run = wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the registry's snapshot follows at the next heartbeat (1 s)
        with panel_engine.connect() as conn:
            children = conn.execute(text(
                "SELECT children FROM archive_worker_runners WHERE name = 'panel-runner' AND stopped_at IS NULL"
            )).scalar()
        if children:
            break
        time.sleep(0.2)
    assert children, "the runner's registry row shows no child"

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Runners").click()
    runner = page.locator('article[data-runner="panel-runner"]')
    expect(runner).to_have_attribute("data-state", "online")
    expect(runner).to_contain_text("panel-slow")  # a capability and the child's worker
    child_row = runner.locator(f'tr[data-pid="{children[0]["pid"]}"]')
    expect(child_row).to_contain_text(short_id(run["run_id"]))
    expect(child_row).to_contain_text("panel-slow")
    expect(runner.get_by_role("button", name="Drain panel-runner")).to_be_visible()
    shot(page, "13-runners-children")
    ensure_idle(panel_engine, "panel-slow")


def test_a_gpu_run_waits_for_a_free_device_and_the_runner_shows_its_devices(page, panel_engine, panel_database_url):
    from tests.panel.conftest import RunnerControl

    gpu_runner = RunnerControl(panel_database_url, name="panel-gpu-runner", capabilities="panel-gpu-a,panel-gpu-b",
                               flags=("--devices", "0", "--per-device", "1"))
    try:
        gpu_runner.start()
        gpu_runner.wait_registered(panel_engine)
        login(page, *ADMIN)
        enqueue_from_card(page, "panel-gpu-a", units=400, delay=0.4)
        wait_db(panel_engine, "panel-gpu-a", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
        enqueue_from_card(page, "panel-gpu-b", units=4, delay=0.1)
        waiting = card(page, "panel-gpu-b")
        expect(waiting).to_have_attribute("data-state", "queued")
        nudge(page)  # the registry shows the child on its device from the next heartbeat (1 s)
        expect(waiting.locator(".queued-reason")).to_contain_text("waiting for a free GPU", timeout=15_000)
        expect(waiting.locator(".queued-reason")).to_contain_text("1 of 1")
        shot(page, "19-workers-waiting-for-a-device")

        page.get_by_role("navigation", name="Main").get_by_role("link", name="Runners").click()
        runner = page.locator('article[data-runner="panel-gpu-runner"]')
        expect(runner.locator("div.device")).to_contain_text("1 of 1 slot busy")
        expect(runner.locator("td.device")).to_have_text("GPU 0")
        shot(page, "20-runners-devices")
        assert last_run(panel_engine, "panel-gpu-b")["status"] == "QUEUED"
    finally:
        ensure_idle(panel_engine, "panel-gpu-a")
        ensure_idle(panel_engine, "panel-gpu-b")
        gpu_runner.stop()


def test_a_viewer_sees_no_controls_and_the_api_refuses(page, panel_engine, running_runner, live_api):
    import httpx

    ensure_idle(panel_engine, "panel-slow")
    # An active run, so that a Cancel button would show if the role allowed it.
    with httpx.Client(base_url=live_api) as admin:
        r = admin.post("/api/v1/auth/login", json={"email": ADMIN[0], "password": ADMIN[1], "issue_token": True})
        token = r.json()["token"]
        r = admin.post("/api/v1/system/workers/panel-slow/runs", json={"options": {"units": 400, "delay": 0.4}},
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")

    login(page, *VIEWER)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    expect(page.locator("#who")).to_contain_text("VIEWER")
    slow = card(page, "panel-slow")
    expect(slow).to_have_attribute("data-state", "running")
    expect(page.get_by_role("button", name="Run", exact=True)).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("^Cancel"))).to_have_count(0)
    expect(page.locator("form.run-form")).to_have_count(0)
    shot(page, "14-viewer-workers")

    page.goto("/#/runners")
    expect(page.locator('article[data-runner="panel-runner"]')).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("^Drain"))).to_have_count(0)
    run = last_run(panel_engine, "panel-slow")
    page.goto(f"/#/runs/{run['run_id']}")
    expect(page.get_by_role("heading", name=re.compile(r"^Run "))).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("^Cancel"))).to_have_count(0)

    # The API refuses anyway, with the viewer's own valid cookie and CSRF token.
    csrf = page.request.get("/api/v1/auth/me").json()["csrf_token"]
    headers = {"X-CSRF-Token": csrf}
    assert page.request.post("/api/v1/system/workers/panel-crash/runs", data={}, headers=headers).status == 403
    assert page.request.post(f"/api/v1/system/runs/{run['run_id']}/cancel", data={}, headers=headers).status == 403
    runner_id = page.request.get("/api/v1/system/runners").json()["runners"][0]["runner_id"]
    assert page.request.post(f"/api/v1/system/runners/{runner_id}/drain", data={}, headers=headers).status == 403
    assert last_run(panel_engine, "panel-slow")["status"] == "RUNNING"
    ensure_idle(panel_engine, "panel-slow")


def test_the_panel_fits_a_phone(browser, live_api, panel_engine):
    context = browser.new_context(base_url=live_api, viewport={"width": 390, "height": 844},
                                  is_mobile=True, has_touch=True, reduced_motion="reduce")
    page = context.new_page()
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        for route, name in (("workers", "15-phone-workers"), ("runs", "16-phone-runs"),
                            ("failures", "17-phone-failures"), ("runners", "18-phone-runners")):
            page.goto(f"/#/{route}")
            expect(page.locator("main h1")).to_be_visible()
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 392, f"{route}: the page is {width} px wide on a 390 px screen"
            shot(page, name)
    finally:
        context.close()


def test_keyboard_only_login_and_navigation(page):
    page.goto("/#/login")
    expect(page.get_by_label("E-mail")).to_be_visible()
    page.get_by_label("E-mail").focus()
    page.keyboard.type(ADMIN[0])
    page.keyboard.press("Tab")
    page.keyboard.type(ADMIN[1])
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Workers")).to_be_focused()
    # Every interactive element has an accessible name (a label, a text or an aria-label).
    unnamed = page.evaluate("""() => [...document.querySelectorAll('input, select, button, a[href]')]
        .filter(el => el.offsetParent !== null)
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.textContent.trim())
        .map(el => el.outerHTML.slice(0, 80))""")
    assert unnamed == []
