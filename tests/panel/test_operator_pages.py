"""The operator's pages in headless chromium, against a live API, a real PostgreSQL and a real runner:
Schedules, a worker's Settings (with its revisions), Retry of a failed run, a run's runner, the
"needs a model" card, and the stale marker when the API stops answering. As ADMIN with every control;
as VIEWER with none, and the API refuses the writes."""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect
from sqlalchemy import text

from scrinalia.domains.archive.run_ids import short_id
from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.scheduler.service import Scheduler
from tests.panel.helpers import ADMIN, PLUGINS, VIEWER, login, shot
from tests.panel.test_panel import card, enqueue_from_card, ensure_idle, nudge, wait_db

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def running_runner(runner_control, panel_engine):
    runner_control.start()
    runner_control.wait_registered(panel_engine)
    return runner_control


def nav(page, name: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=name).click()


def test_schedules_as_admin(page, panel_engine):
    login(page, *ADMIN)
    nav(page, "Schedules")
    expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
    form = page.get_by_role("form", name="Add a schedule")
    form.get_by_label("Worker").select_option("panel-slow")
    form.get_by_label("Every (minutes)").fill("90")
    form.get_by_label("Request (JSON)").fill('{"options": {"units": 4}}')
    form.get_by_role("button", name="Add schedule").click()
    row = page.locator('tr[data-worker="panel-slow"]')
    expect(row).to_contain_text("1 h 30 min")
    expect(row).to_contain_text("enabled")
    expect(row.locator("time")).to_have_count(1)  # the next tick, relative
    expect(row).to_contain_text("not ticked yet")

    # one schedule per worker: a second is refused and says which one exists
    form.get_by_label("Every (minutes)").fill("5")
    form.get_by_label("Request (JSON)").fill("")
    form.get_by_role("button", name="Add schedule").click()
    expect(form.locator(".form-error")).to_contain_text("already has schedule")
    # a bad request is refused by the API, per field
    form.get_by_label("Worker").select_option("panel-crash")
    form.get_by_label("Request (JSON)").fill('{"options": {"nope": 1}}')
    form.get_by_role("button", name="Add schedule").click()
    expect(form.locator(".form-error")).to_contain_text("request.options.nope")
    shot(page, "30-schedules-admin")

    row.get_by_role("button", name="Disable the panel-slow schedule").click()
    expect(row).to_contain_text("disabled")
    row.get_by_role("button", name="Enable the panel-slow schedule").click()
    expect(row).to_contain_text("enabled")

    # a tick whose request no longer validates says why on the page (written around the validation)
    with panel_engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at) "
                          "VALUES ('panel-crash', 600, CAST(:r AS jsonb), now())"),
                     {"r": json.dumps({"options": {"gone": 1}})})
    scheduler = Scheduler(panel_engine, load_catalogue(PLUGINS))
    try:
        outcomes = {f.worker_name: f.outcome for f in scheduler.tick().fired}
        # the panel-slow schedule was due at once (no first delay): it enqueued its run
        assert outcomes["panel-slow"] == "enqueued" and outcomes["panel-crash"].startswith("refused: options.gone")
    finally:
        scheduler.release()
    nudge(page)
    crash_row = page.locator('tr[data-worker="panel-crash"]')
    expect(crash_row.locator(".outcome.refused")).to_contain_text("options.gone")
    shot(page, "31-schedules-refused")

    crash_row.get_by_role("button", name="Remove the panel-crash schedule").click()
    crash_row.get_by_role("button", name="Yes, remove it").click()
    expect(crash_row).to_have_count(0)
    expect(row.get_by_role("link", name=re.compile(r"^run "))).to_be_visible()  # its last run, linked
    row.get_by_role("button", name="Remove the panel-slow schedule").click()
    row.get_by_role("button", name="Yes, remove it").click()
    expect(page.locator("tr[data-schedule]")).to_have_count(0)
    ensure_idle(panel_engine, "panel-slow")


def test_settings_with_revisions_and_the_needs_a_model_card(page, panel_engine):
    login(page, *ADMIN)
    model_card = card(page, "panel-model")
    expect(model_card).to_have_attribute("data-needs", "needs a model")
    expect(model_card.locator(".needs-setup")).to_contain_text("No model directory is set")
    # pressing Run anyway: the API refuses it and the form says what to set
    model_card.get_by_role("button", name="Run", exact=True).click()
    expect(model_card.locator(".run-form")).to_contain_text("engine_options.model")
    shot(page, "32-needs-a-model")

    model_card.locator(".needs-setup").get_by_role("link", name="Open its settings to set it").click()
    expect(page).to_have_url(re.compile(r"#/workers/panel-model/settings$"))
    expect(page.get_by_role("heading", name="Settings · Needs a model (test)")).to_be_visible()
    form = page.get_by_role("form", name="Settings of Needs a model (test)")
    form.get_by_label("Model", exact=True).fill("/srv/models/tiny")
    form.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status").filter(has_text="Saved: revision 1")).to_be_visible()
    revisions = page.locator("table.revisions")
    expect(revisions.locator('tr[data-revision="1"]')).to_contain_text(ADMIN[0])
    expect(revisions.locator('tr[data-revision="1"]')).to_contain_text("engine_options.model: — → /srv/models/tiny")

    # out of range: refused by the API beside its field, nothing saved
    page.goto("/#/workers/panel-slow/settings")
    slow_form = page.get_by_role("form", name="Settings of Slow batches (test)")
    slow_form.get_by_label("Units", exact=True).fill("8")
    slow_form.get_by_role("button", name="Save settings").click()
    expect(page.locator('table.revisions tr[data-revision="1"]')).to_contain_text("options.units: — → 8")
    slow_form.get_by_label("Delay", exact=True).fill("99")
    slow_form.get_by_role("button", name="Save settings").click()
    expect(slow_form.locator('[data-error-for="options.delay"]')).to_contain_text("60")
    expect(page.locator("table.revisions tbody tr")).to_have_count(1)
    nudge(page)
    expect(page.locator("section", has=page.get_by_role("heading", name="Effective now"))).to_contain_text("persisted")
    shot(page, "33-settings-admin")

    # the card no longer needs a model
    nav(page, "Workers")
    expect(card(page, "panel-model")).to_have_attribute("data-needs", "")
    with panel_engine.begin() as conn:  # back to the defaults for the other tests
        conn.execute(text("DELETE FROM archive_worker_settings WHERE worker_name = 'panel-slow'"))


def test_retry_a_failed_run_and_its_runner(page, panel_engine, running_runner):
    login(page, *ADMIN)
    enqueue_from_card(page, "panel-crash")
    failed = wait_db(panel_engine, "panel-crash", lambda r: r["status"] == "FAILED", 30, "FAILED")
    page.goto(f"/#/runs/{failed['run_id']}")
    summary = page.locator("section", has=page.get_by_role("heading", name="Summary"))
    runner_link = summary.get_by_role("link", name="panel-runner")
    expect(runner_link).to_be_visible()
    expect(page.locator("section", has=page.get_by_role("heading", name="Exit"))).to_contain_text("Exit code")

    page.get_by_role("button", name="Retry").click()
    expect(page).not_to_have_url(re.compile(str(failed["run_id"])))
    retry_summary = page.locator("section", has=page.get_by_role("heading", name="Summary"))
    expect(retry_summary.get_by_role("link", name=short_id(failed["run_id"]))).to_be_visible()  # Retry of
    with panel_engine.connect() as conn:
        row = conn.execute(text("SELECT retry_of, attempt, trigger FROM archive_worker_runs "
                                "WHERE retry_of = :r"), {"r": failed["run_id"]}).one()
    assert row.attempt == 2 and row.trigger == "PANEL"  # the panel's Retry (issue 28, 7)
    wait_db(panel_engine, "panel-crash", lambda r: r["status"] == "FAILED", 30, "the retry FAILED too")
    shot(page, "34-retry")

    page.goto(f"/#/runs/{failed['run_id']}")
    summary = page.locator("section", has=page.get_by_role("heading", name="Summary"))
    summary.get_by_role("link", name="panel-runner").click()
    expect(page).to_have_url(re.compile(r"#/runners\?runner="))
    expect(page.locator('article.highlight[data-runner="panel-runner"]')).to_be_visible()


def test_a_viewer_sees_the_pages_without_controls_and_the_api_refuses(page, panel_engine, running_runner):
    with panel_engine.begin() as conn:
        schedule_id = conn.execute(text(
            "INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at) "
            "VALUES ('panel-slow', 3600, '{}', now() + interval '1 hour') RETURNING id")).scalar_one()
        failed = conn.execute(text(
            "SELECT run_id FROM archive_worker_runs WHERE status = 'FAILED' ORDER BY id DESC LIMIT 1")).scalar()
    if failed is None:
        ensure_idle(panel_engine, "panel-crash")
        from scrinalia.domains.archive import ledger

        ledger.enqueue(panel_engine, "panel-crash", {})
        failed = wait_db(panel_engine, "panel-crash", lambda r: r["status"] == "FAILED", 30, "FAILED")["run_id"]

    login(page, *VIEWER)
    nav(page, "Schedules")
    expect(page.locator(f'tr[data-schedule="{schedule_id}"]')).to_contain_text("panel-slow")
    expect(page.get_by_role("form", name="Add a schedule")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("^(Disable|Enable|Remove)"))).to_have_count(0)
    shot(page, "35-viewer-schedules")

    page.goto("/#/workers/panel-slow/settings")
    expect(page.get_by_role("heading", name="Settings · Slow batches (test)")).to_be_visible()
    expect(page.get_by_text("Only an ADMIN changes settings.")).to_be_visible()
    expect(page.locator("form.settings-form")).to_have_count(0)

    page.goto(f"/#/runs/{failed}")
    expect(page.get_by_role("heading", name=re.compile(r"^Run "))).to_be_visible()
    expect(page.get_by_role("button", name="Retry")).to_have_count(0)

    csrf = page.request.get("/api/v1/auth/me").json()["csrf_token"]
    headers = {"X-CSRF-Token": csrf}
    assert page.request.post("/api/v1/system/schedules", data={"worker_name": "panel-crash", "interval_seconds": 600},
                             headers=headers).status == 403
    assert page.request.patch(f"/api/v1/system/schedules/{schedule_id}", data={"enabled": False},
                              headers=headers).status == 403
    assert page.request.delete(f"/api/v1/system/schedules/{schedule_id}", headers=headers).status == 403
    assert page.request.put("/api/v1/system/workers/panel-slow/settings", data={"db_batch_size": 3},
                            headers=headers).status == 403
    assert page.request.post(f"/api/v1/system/runs/{failed}/retry", data={}, headers=headers).status == 403
    with panel_engine.connect() as conn:
        assert conn.execute(text("SELECT enabled FROM archive_worker_schedules WHERE id = :i"),
                            {"i": schedule_id}).scalar_one() is True
        assert conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE retry_of = :r"),
                            {"r": failed}).scalar_one() == 0
    with panel_engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_worker_schedules WHERE id = :i"), {"i": schedule_id})


def test_a_stale_marker_when_the_api_does_not_answer(page):
    login(page, *ADMIN)
    expect(card(page, "panel-slow")).to_be_visible()
    expect(page.locator("#stale-bar")).to_be_hidden()
    page.route("**/api/v1/system/**", lambda route: route.abort())
    nudge(page)
    expect(page.locator("#stale-bar")).to_contain_text("Stale since")
    expect(page.locator("body")).to_have_attribute("data-stale", "true")
    shot(page, "36-stale")
    page.unroute("**/api/v1/system/**")
    nudge(page)
    expect(page.locator("#stale-bar")).to_be_hidden()
