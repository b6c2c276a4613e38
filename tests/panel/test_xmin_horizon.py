"""The panel's Runners page names the oldest holder of the database's xmin horizon (decision 0371), in the
real browser against the live API: an analyst's REPEATABLE READ session left open shows with its pid,
its application and its state."""
from __future__ import annotations

from playwright.sync_api import expect
from sqlalchemy import text

from tests.panel.helpers import ADMIN, login


def test_the_runners_page_names_a_repeatable_read_session_holding_the_horizon(page, panel_engine):
    with panel_engine.connect() as holder:
        holder.execution_options(isolation_level="REPEATABLE READ")
        holder.execute(text("SET application_name = 'analyst-session'"))
        holder.execute(text("SELECT count(*) FROM archive_worker_runs"))  # its snapshot holds the xmin
        pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with panel_engine.connect() as other:  # transactions after its snapshot: its xmin is the oldest
            for _ in range(3):
                other.execute(text("SELECT pg_current_xact_id()"))
                other.commit()
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        page.goto("/#/runners")
        horizon = page.locator(".xmin-horizon")
        expect(horizon).to_contain_text(f"by pid {pid} (analyst-session, idle in transaction)")
        holder.rollback()
    page.reload()  # let go: the sentence no longer names it
    expect(page.locator(".xmin-horizon")).to_contain_text("Database: ")
    expect(page.locator(".xmin-horizon")).not_to_contain_text("analyst-session")
