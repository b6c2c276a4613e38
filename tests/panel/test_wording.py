"""The panel's counts in words: "1 schedule", not "1 schedules"."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect
from sqlalchemy import text

from tests.panel.helpers import ADMIN, login

pytestmark = [pytest.mark.browser]


def test_one_schedule_is_one_schedule(page, panel_engine):
    with panel_engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_worker_schedules"))
        conn.execute(text("INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at) "
                          "VALUES ('panel-slow', 3600, '{}', now() + interval '1 hour')"))
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        page.goto("/#/schedules")
        expect(page.locator("main")).to_contain_text("1 schedule · 1 enabled")
        expect(page.locator("main")).not_to_contain_text("1 schedules")
    finally:
        with panel_engine.begin() as conn:
            conn.execute(text("DELETE FROM archive_worker_schedules"))
