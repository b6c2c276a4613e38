"""The panel's charts in a real chromium (uPlot, vendored; decisions 0160, 0161): a worker page's runs per
hour agree with the ledger, a running run's chart gains points live (through the event stream, no
reload), and every chart fits a 390 px phone. Every page is walked under the Content-Security-Policy
(the ``page`` fixture fails on any violation): uPlot draws with no inline style."""
from __future__ import annotations

import time
import uuid

import pytest
from playwright.sync_api import expect
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from tests.ledger.helpers import register_runner
from tests.panel.helpers import ADMIN, login, shot
from tests.panel.test_live import _wait_serving
from tests.panel.test_panel import ensure_idle, wait_db

pytestmark = [pytest.mark.browser]

TREND_WORKER = "panel-model"  # no runner claims it: the history below is all it has
SAMPLED_WORKER = "panel-gpu-a"  # no runner of this module serves it: its one run is the 390 px test's own
CHART = "document.querySelector('figure[data-chart=\"{kind}\"]')"
HAS_DATA = "() => {{ const f = " + CHART + "; return Boolean(f && f.chart && f.chart.uplot); }}"


def _history(engine: Engine) -> None:
    """Finished runs of TREND_WORKER at known ages (hours) and outcomes, through the ledger's own steps."""
    runner = register_runner(engine, [TREND_WORKER], name=f"history-{uuid.uuid4().hex[:6]}")
    # The 24 h window starts at the top of the hour 23 h before the current one: 22.5 h ago is always in it,
    # 30 h ago never, whatever the minute the test runs at (23.5 h was in it only past half past).
    ages = [0.2, 0.3, 1.5, 2.5, 2.6, 2.7, 12.0, 22.5, 30.0, 50.0, 160.0, 200.0]
    outcomes = ["SUCCESS", "FAILED", "SUCCESS", "SUCCESS", "INTERRUPTED", "SUCCESS", "CANCELLED", "SUCCESS",
                "FAILED", "SUCCESS", "SUCCESS", "SUCCESS"]
    for i, (age, outcome) in enumerate(zip(ages, outcomes, strict=True)):
        ledger.enqueue(engine, TREND_WORKER, {})
        run = ledger.claim_next(engine, runner, [TREND_WORKER], 60)
        assert run is not None
        ledger.finish(engine, run.run_id, runner, FinishParams(outcome))
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET finished_at = now() - make_interval(secs => :a), "
                              "duration_ms = :ms WHERE run_id = :r"),
                         {"a": age * 3600, "ms": 1000 * (i + 1), "r": run.run_id})


@pytest.fixture(scope="module")
def trend_history(panel_engine: Engine) -> None:
    """The history, written once for the module's tests whatever their order (each counts it exactly)."""
    _history(panel_engine)


def _sampled_run(engine: Engine) -> uuid.UUID:
    """A finished run whose chart has points (two progress samples ten seconds apart, then the finish) and
    whose runner held a slot for a minute (its slots chart has a busy bucket)."""
    runner = register_runner(engine, [SAMPLED_WORKER], name=f"sampled-{uuid.uuid4().hex[:6]}")
    run = ledger.create_running(engine, SAMPLED_WORKER, {}, runner_id=runner, lease_seconds=60)
    ledger.record_progress(engine, runner, {run.run_id: {"done": 10, "total": 40, "unit": "unit"}})
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_run_samples SET at = at - interval '10 seconds' WHERE run_id = :r"),
                     {"r": run.run_id})
        conn.execute(text("UPDATE archive_worker_runs SET started_at = started_at - interval '60 seconds' "
                          "WHERE run_id = :r"), {"r": run.run_id})
    ledger.record_progress(engine, runner, {run.run_id: {"done": 30, "total": 40, "unit": "unit"}})
    ledger.finish(engine, run.run_id, runner, FinishParams("SUCCESS", progress={"done": 40, "total": 40}))
    return run.run_id


def _ledger_count(engine: Engine, since: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE worker_name = :w "
                                 "AND finished_at >= CAST(:since AS timestamptz)"),
                            {"w": TREND_WORKER, "since": since}).scalar_one()


def _bars(page) -> dict:
    """The chart's own data: uPlot's series 1 is the top of each stack, the bucket's total."""
    return page.evaluate("() => { const f = " + CHART.format(kind="runs-per-hour")
                         + "; return { total: f.chart.uplot.data[1].reduce((s, v) => s + v, 0),"
                           " buckets: f.chart.uplot.data[0].length, since: f.chart.raw.since,"
                           " window: f.chart.raw.window }; }")


def test_a_worker_page_shows_runs_per_hour_that_sum_to_the_ledger(page, panel_engine, trend_history):
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    page.locator(f'article[data-worker="{TREND_WORKER}"]').get_by_role("link", name="Trend").click()
    expect(page).to_have_url(f"/#/workers/{TREND_WORKER}")
    page.wait_for_function(HAS_DATA.format(kind="runs-per-hour"))
    expect(page.locator('figure[data-chart="runs-per-hour"] canvas')).to_be_visible()
    expect(page.locator('figure[data-chart="durations"] canvas')).to_be_visible()
    day = _bars(page)
    assert day["window"] == "24h" and day["buckets"] == 24
    assert day["total"] == _ledger_count(panel_engine, day["since"]) == 8
    expect(page.locator(".chart-totals")).to_have_attribute("data-total", "8")
    shot(page, "charts-01-worker-24h")

    page.get_by_role("button", name="7 d").click()
    page.wait_for_function("() => " + CHART.format(kind="runs-per-hour") + ".chart.raw.window === '7d'")
    week = _bars(page)
    assert week["buckets"] == 168
    assert week["total"] == _ledger_count(panel_engine, week["since"]) == 11  # 200 h ago is past 7 d
    # The legend shows each outcome's own count under the cursor, not the stack's running sum.
    legend = page.locator('figure[data-chart="runs-per-hour"] .u-legend')
    expect(legend).to_contain_text("Success")
    expect(legend).to_contain_text("Failed")
    shot(page, "charts-02-worker-7d")


def test_a_running_runs_chart_gains_points_live(page, panel_engine, runner_control):
    ensure_idle(panel_engine, "panel-slow")
    runner_control.start()
    runner_control.wait_registered(panel_engine)
    _wait_serving(panel_engine, runner_control.name)
    run = ledger.enqueue(panel_engine, "panel-slow", {"options": {"units": 40, "delay": 0.5}})  # ~10 s
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    page.goto(f"/#/runs/{run.run_id}")
    expect(page.locator("body")).to_have_attribute("data-live", "on")
    page.wait_for_function(HAS_DATA.format(kind="run"), timeout=20_000)
    page.evaluate("window.__noReload = true")
    first = page.evaluate(CHART.format(kind="run") + ".chart.uplot.data[0].length")
    # More points while the run is still RUNNING: the safety poll is 30 s, so only the stream explains it.
    page.wait_for_function("(n) => " + CHART.format(kind="run") + ".chart.uplot.data[0].length > n + 1",
                           arg=first, timeout=8_000)
    seen_at = time.time()
    grown = page.evaluate(CHART.format(kind="run") + ".chart.uplot.data")
    with panel_engine.connect() as conn:
        finished = conn.execute(text("SELECT extract(epoch FROM finished_at) FROM archive_worker_runs "
                                     "WHERE run_id = :r"), {"r": run.run_id}).scalar_one()
    assert finished is None or float(finished) > seen_at - 1, "the points came after the run ended"
    assert any(v is not None and v > 0 for v in grown[1]), f"no units/s: {grown}"
    assert any(v is not None and v > 1_000_000 for v in grown[2]), f"no RSS: {grown}"
    shot(page, "charts-03-run-live")
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "SUCCESS", 60, "SUCCESS")
    expect(page.locator(".badge", has_text="SUCCESS").first).to_be_visible(timeout=10_000)
    done = page.evaluate("() => { const r = " + CHART.format(kind="run") + ".chart.raw; "
                         "return r.points[r.points.length - 1].done; }")
    assert done == 40
    assert page.evaluate("window.__noReload") is True


def test_the_charts_render_at_390_px(browser, live_api, panel_engine, panel_users, trend_history):
    """Every chart at 390 px, on what this test makes itself (the history, a run with samples): it passes
    alone and in any order."""
    from tests.panel.helpers import watch_csp

    run_id = _sampled_run(panel_engine)

    context = browser.new_context(base_url=live_api, viewport={"width": 390, "height": 844},
                                  color_scheme="dark", reduced_motion="reduce")
    violations = watch_csp(context)
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        targets = [(f"/#/workers/{TREND_WORKER}", ["runs-per-hour", "durations"]), ("/#/runners", ["runner-slots"]),
                   (f"/#/runs/{run_id}", ["run"])]
        for url, kinds in targets:
            page.goto(url)
            for kind in kinds:
                # Any of them: a runner that has held no slot shows a sentence, not a chart (issue 28, 1).
                page.wait_for_function("() => [...document.querySelectorAll('figure[data-chart=\"" + kind + "\"]')]"
                                       ".some((f) => f.chart && f.chart.uplot)")
                box = page.locator(f'figure[data-chart="{kind}"] canvas').first.bounding_box()
                assert box is not None and 200 < box["width"] <= 390 and box["x"] >= 0, (url, kind, box)
                assert box["x"] + box["width"] <= 390, (url, kind, box)
            # Nothing wider than the phone: no sideways scrolling.
            assert page.evaluate("document.documentElement.scrollWidth") <= 390, url
            shot(page, f"charts-04-390px-{url.split('/')[2] if url.count('/') > 1 else 'page'}")
    finally:
        context.close()
    assert not errors, errors
    assert not violations, violations
