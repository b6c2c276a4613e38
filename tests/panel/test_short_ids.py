"""The panel's run ids (decision 0143): four runs started within a minute show four distinct short ids
(the UUIDv7's random tail, the same rule as the logs and ``status``), and a short id typed into the Runs
page opens its run."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.run_ids import short_id
from tests.panel.helpers import ADMIN, login, shot
from tests.panel.test_panel import ensure_idle

pytestmark = [pytest.mark.browser]


def test_four_runs_in_a_minute_show_four_ids_and_a_typed_one_finds_its_run(page, panel_engine):
    ensure_idle(panel_engine, "panel-crash")
    runs = []
    for _ in range(4):
        run = ledger.enqueue(panel_engine, "panel-crash", {}, trigger="API")
        ledger.request_cancel(panel_engine, run.run_id, "test")
        runs.append(run)
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    page.goto("/#/runs?worker=panel-crash")
    for run in runs:
        expect(page.locator(f'a[href="#/runs/{run.run_id}"]')).to_have_text(short_id(run.run_id))
    shown = {page.locator(f'a[href="#/runs/{run.run_id}"]').inner_text() for run in runs}
    assert len(shown) == 4, shown
    shot(page, "43-short-ids")

    page.get_by_label("Run id").fill(short_id(runs[1].run_id))
    page.get_by_role("button", name="Go to run").click()
    expect(page.get_by_role("heading", name=f"Run {short_id(runs[1].run_id)}")).to_be_visible()
    expect(page.locator("main")).to_contain_text(str(runs[1].run_id))
