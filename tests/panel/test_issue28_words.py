"""Issue 28: what a new user tripped over in the panel, each in a real chromium against a live API, a real
PostgreSQL and (for the live run) a real runner. One API and one browser for the module.

1. the duration chart's point lies inside the plot at 1280 and 390 px on a fresh install; a runner that
   has held no slot says so instead of drawing a flat line;
4. a run's chart says "items/s" from its first point, its time ticks are whole seconds, the card says the
   run is starting (not "0 units") while the model loads, and the first ETA is not a multiple of the truth;
5. the engine comes from the catalogue ("tiny", not "none"); the needs-a-model banner is in words;
6. a quarantined schedule's last outcome is its run's end, the fingerprint reads as it is, the worker list
   is not cut;
7. plurals ("1 run finished", "1 sample"), the two batch sizes told apart, options labelled in words;
9. no focus box on a page opened directly, no 401 in the console of a first visit, a live run's chart read
   at most every 3 s, and "Live" in green beside its word.
"""
from __future__ import annotations

import re
import time
import uuid

import pytest
from playwright.sync_api import expect
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from tests.ledger.helpers import register_runner
from tests.panel.helpers import ADMIN, login, shot, watch_csp
from tests.panel.test_live import _wait_serving
from tests.panel.test_panel import card, ensure_idle, wait_db

pytestmark = [pytest.mark.browser]

TREND_WORKER = "panel-model"  # no runner claims it: the history below is all it has
FIG = "document.querySelector('figure[data-chart=\"{kind}\"]')"


def _runs_in_one_hour(engine: Engine, worker: str, n: int = 2) -> None:
    """``n`` successful runs that finished a minute ago: a fresh install's whole history."""
    runner = register_runner(engine, [worker], name=f"fresh-{uuid.uuid4().hex[:6]}")
    for i in range(n):
        ledger.enqueue(engine, worker, {})
        run = ledger.claim_next(engine, runner, [worker], 60)
        assert run is not None
        ledger.finish(engine, run.run_id, runner, FinishParams("SUCCESS"))
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET finished_at = now() - interval '1 minute', "
                              "duration_ms = :ms WHERE run_id = :r"), {"ms": 300 + 100 * i, "r": run.run_id})


_POINT = """() => {
  const u = """ + FIG.format(kind="durations") + """.chart.uplot;
  const i = u.data[1].findIndex((v) => v !== null);
  const x = u.valToPos(u.data[0][i], 'x', true), y = u.valToPos(u.data[1][i], 'y', true);
  const ctx = u.ctx;
  // the darkest pixel in a 5x5 box around the point's centre: the dot (or the line through it) is there
  let dark = 0;
  for (let dx = -2; dx <= 2; dx++) for (let dy = -2; dy <= 2; dy++) {
    const [r, g, b, a] = ctx.getImageData(Math.round(x) + dx, Math.round(y) + dy, 1, 1).data;
    dark = Math.max(dark, a * (1 - (r + g + b) / 765));
  }
  return { x, y, left: u.bbox.left, top: u.bbox.top, right: u.bbox.left + u.bbox.width,
           bottom: u.bbox.top + u.bbox.height, dark, pxr: window.devicePixelRatio };
}"""


@pytest.mark.parametrize("width", [1280, 390])
def test_the_duration_chart_of_a_fresh_install_shows_its_point_inside_the_plot(browser, live_api, panel_engine,
                                                                               panel_users, width):
    with panel_engine.connect() as conn:
        fresh = conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE worker_name = :w"),
                             {"w": TREND_WORKER}).scalar_one() == 0
    if fresh:
        _runs_in_one_hour(panel_engine, TREND_WORKER)
    context = browser.new_context(base_url=live_api, viewport={"width": width, "height": 900},
                                  color_scheme="light", reduced_motion="reduce")
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        page.goto(f"/#/workers/{TREND_WORKER}")
        page.wait_for_function("() => { const f = " + FIG.format(kind="durations") + "; return f && f.chart.uplot; }")
        p = page.evaluate(_POINT)
        margin = 3 * p["pxr"]  # the dot's radius, in canvas pixels: wholly inside, not cut by an edge
        assert p["left"] + margin <= p["x"] <= p["right"] - margin, p
        assert p["top"] + margin <= p["y"] <= p["bottom"] - margin, p
        assert p["dark"] > 80, f"nothing drawn at the point: {p}"
        caption = page.locator('figure[data-chart="durations"] figcaption')
        expect(caption).to_contain_text("Latest median duration")
        shot(page, f"i28-durations-fresh-{width}")
    finally:
        context.close()


def test_a_runner_that_held_no_slot_says_so_instead_of_a_flat_line(page, panel_engine):
    name = f"idle-{uuid.uuid4().hex[:6]}"
    register_runner(panel_engine, ["panel-model"], name=name)
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    page.goto("/#/runners")
    runner = page.locator(f'article[data-runner="{name}"]')
    figure = runner.locator('figure[data-chart="runner-slots"]')
    expect(figure.locator(".chart-empty")).to_contain_text("No run has held one of its 1 slots")
    expect(figure.locator("canvas")).to_have_count(0)


def test_a_run_says_its_unit_and_that_it_is_starting(page, panel_engine, runner_control):
    ensure_idle(panel_engine, "panel-slow")
    runner_control.start()
    runner_control.wait_registered(panel_engine)
    _wait_serving(panel_engine, runner_control.name)
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    # Every text the progress line shows, with the page's time, from now on.
    page.evaluate("""() => { window.__progress = []; new MutationObserver(() => {
        const el = document.querySelector('article[data-worker="panel-slow"] .progress-text');
        const t = el ? el.textContent : null;
        const last = window.__progress[window.__progress.length - 1];
        if (t && last?.t !== t) window.__progress.push({ at: Date.now(), t });
      }).observe(document.getElementById('main'), { subtree: true, childList: true, characterData: true }); }""")
    # 4 s of loading (heartbeats sample the memory meanwhile), then 12 batches of 2 items, 0.5 s each.
    run = ledger.enqueue(panel_engine, "panel-slow", {"options": {"units": 24, "delay": 0.5, "load": 4}})
    slow = card(page, "panel-slow")
    expect(slow.locator(".progress-text")).to_contain_text("Starting: loading the model", timeout=20_000)
    expect(slow.locator(".progress-text")).not_to_contain_text("0 units")
    # The run's page, open while the model loads: its chart is made from heartbeat samples without a unit.
    run_page = page.context.new_page()
    run_page.goto(f"/#/runs/{run.run_id}")
    run_page.wait_for_function("() => { const f = " + FIG.format(kind="run") + "; return f && f.chart.uplot; }",
                               timeout=20_000)
    wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "SUCCESS", 60, "SUCCESS")
    legend = run_page.locator('figure[data-chart="run"] .u-legend')
    expect(legend).to_contain_text("items/s")
    expect(legend).not_to_contain_text("units/s")
    # Whole seconds between the time ticks, however young the run was when its chart was made.
    splits = run_page.evaluate("() => " + FIG.format(kind="run") + ".chart.uplot.axes[0]._splits")
    assert len(splits) >= 2 and min(b - a for a, b in zip(splits, splits[1:], strict=False)) >= 1, splits
    expect(run_page.locator('figure[data-chart="run"] figcaption')).to_contain_text(re.compile(r"\d+ samples?[,.]"))
    texts = page.evaluate("window.__progress")
    etas = [t for t in texts if "left" in t["t"]]
    assert etas, texts
    with panel_engine.connect() as conn:
        finished_ms = conn.execute(text("SELECT extract(epoch FROM finished_at) * 1000 FROM archive_worker_runs "
                                        "WHERE run_id = :r"), {"r": run.run_id}).scalar_one()
    first = etas[0]
    m = re.search(r"about ([\d.]+) (ms|s|min)", first["t"])
    assert m, first
    said = float(m.group(1)) * {"ms": 0.001, "s": 1, "min": 60}[m.group(2)]
    actual = (float(finished_ms) - first["at"]) / 1000
    # The old ETA counted the 4 s of loading as work: its first estimate here said about 50 s for ~5 s left.
    # Now from the page's own samples only; the first of them is taken two batches in, and on a loaded host
    # a batch's 0.5 s may stretch, so the bound leaves room for that noise and still refuses the old count.
    assert said <= 3 * actual + 2, (said, actual, texts)


def test_the_engine_comes_from_the_catalogue_and_the_banner_is_in_words(page):
    login(page, *ADMIN)
    model = card(page, "panel-model")
    expect(model.locator("dd").filter(has_text="tiny")).to_have_count(1)
    banner = model.locator(".needs-setup")
    expect(banner).to_contain_text("Needs a model (test) needs a model. No model directory is set")
    for raw in ("engine_options", "is required", "/api/", "--", "Workers >"):
        expect(banner).not_to_contain_text(raw)


def test_a_quarantined_schedule_says_how_its_runs_ended(page, panel_engine):
    run = ledger.enqueue(panel_engine, "panel-flaky", {})
    with panel_engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_worker_schedules"))
        fingerprint = conn.execute(text(
            "UPDATE archive_worker_runs SET status = 'FAILED', started_at = now(), finished_at = now(), "
            "exit_reason = 'exception', error = 'ModuleNotFoundError: No module named torch_tiny_ner in model_dir 3' "
            "WHERE run_id = :r RETURNING error_fingerprint"), {"r": run.run_id}).scalar_one()
        assert "_" in fingerprint, fingerprint
        conn.execute(text(
            "INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at, enabled, "
            "last_tick_at, last_run_id, last_outcome, quarantined_at, quarantine_reason, quarantine_fingerprint, "
            "quarantine_run_id) VALUES ('panel-flaky', 300, '{}', now(), false, now(), :r, 'enqueued', now(), "
            "'3 retry chains in a row ended FAILED with one error', :f, :r)"), {"r": run.run_id, "f": fingerprint})
    try:
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        page.goto("/#/schedules")
        row = page.locator('tr[data-schedule][data-worker="panel-flaky"]')
        outcome = row.locator('td[data-label="Last outcome"]')
        expect(outcome).to_contain_text("its run ended FAILED")
        expect(outcome.locator(".outcome")).not_to_have_text("enqueued")
        fp = row.locator(".fingerprint")
        expect(fp).to_have_text(fingerprint)
        style = fp.evaluate("el => { const s = getComputedStyle(el); return [s.textDecorationLine, s.wordBreak]; }")
        assert style == ["none", "normal"], style  # no underline over "_", no break inside a word
        # The worker list is as wide as its longest option.
        fit = page.get_by_label("Worker").evaluate("""sel => {
            const probe = document.createElement('span');
            probe.style.font = getComputedStyle(sel).font;
            probe.style.position = 'absolute';
            document.body.append(probe);
            let widest = 0;
            for (const o of sel.options) {
              probe.textContent = o.textContent;
              widest = Math.max(widest, probe.getBoundingClientRect().width);
            }
            probe.remove();
            return { widest, inner: sel.clientWidth - parseFloat(getComputedStyle(sel).paddingLeft) - 16 };
        }""")
        assert fit["widest"] <= fit["inner"], fit
        shot(page, "i28-schedules-quarantined")
    finally:
        with panel_engine.begin() as conn:
            conn.execute(text("DELETE FROM archive_worker_schedules"))


def test_plurals_and_labels_in_words(page, panel_engine):
    worker = "panel-gpu-b"  # no runner of this module advertises it: the one run below is all it has
    ensure_idle(panel_engine, worker)
    runner = register_runner(panel_engine, [worker], name=f"one-{uuid.uuid4().hex[:6]}")
    with panel_engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_worker_runs WHERE worker_name = :w"), {"w": worker})
    ledger.enqueue(panel_engine, worker, {})
    run = ledger.claim_next(panel_engine, runner, [worker], 60)
    assert run is not None
    ledger.record_progress(panel_engine, runner, {run.run_id: {"done": 1, "total": 10, "unit": "item"}})
    ledger.finish(panel_engine, run.run_id, runner, FinishParams("SUCCESS"))
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    page.goto(f"/#/workers/{worker}")
    expect(page.locator(".chart-totals")).to_contain_text("1 run finished in the last 24 hours")
    page.goto(f"/#/runs/{run.run_id}")
    expect(page.locator('figure[data-chart="run"] figcaption')).to_contain_text(re.compile(r"^1 sample[,.]"))
    page.goto("/#/workers")
    slow = card(page, "panel-slow")
    slow.get_by_text("Options", exact=True).click()
    expect(slow.get_by_label("Database batch")).to_be_visible()
    expect(slow.get_by_label("Units", exact=True)).to_be_visible()
    hints = slow.locator(".field .hint").all_text_contents()
    assert not any(re.search(r"· (float|int|str) ·|\d–\d", h) for h in hints), hints
    assert any("from 0.0 to 60.0" in h or "from 0 to 60" in h for h in hints), hints
    ner = card(page, "ner")
    ner.get_by_text("Options", exact=True).click()
    expect(ner.get_by_label("Database batch")).to_be_visible()
    expect(ner.get_by_label("Model batch size")).to_be_visible()


def test_no_focus_box_no_401_a_calm_chart_poll_and_a_green_live_dot(browser, live_api, panel_engine, panel_users,
                                                                     runner_control):
    context = browser.new_context(base_url=live_api, viewport={"width": 1280, "height": 900},
                                  color_scheme="light", reduced_motion="reduce")
    watch_csp(context)
    page = context.new_page()
    page.set_default_timeout(15_000)
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    try:
        # A first visit: straight to the login page, nothing refused on the way.
        page.goto("/")
        expect(page.get_by_role("button", name="Log in")).to_be_visible()
        assert not [c for c in console if "401" in c], console
        login(page, *ADMIN)
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        # A page opened directly (a bookmark, a reload): no focus box on a heading the user never moved to.
        page.goto("/#/runners")
        page.reload()
        expect(page.get_by_role("heading", name="Runners")).to_be_visible()
        outline = page.evaluate("() => { const a = document.activeElement; "
                                "return [a.tagName, getComputedStyle(a).outlineStyle]; }")
        assert outline[0] != "H1" or outline[1] == "none", outline
        # Live: a green dot beside the word.
        expect(page.locator("body")).to_have_attribute("data-live", "on")
        expect(page.locator("#refresh-state")).to_contain_text("Live")
        dot = page.evaluate(
            "() => [getComputedStyle(document.querySelector('#refresh-state .dot')).backgroundColor, "
            "getComputedStyle(document.documentElement).getPropertyValue('--ok').trim()]")
        ok = dot[1].lstrip("#")
        assert dot[0] == f"rgb({int(ok[0:2], 16)}, {int(ok[2:4], 16)}, {int(ok[4:6], 16)})", dot
        # A live run's chart: read at most every 3 s, however often its progress events come.
        ensure_idle(panel_engine, "panel-slow")
        runner_control.start()
        runner_control.wait_registered(panel_engine)
        _wait_serving(panel_engine, runner_control.name)
        run = ledger.enqueue(panel_engine, "panel-slow", {"options": {"units": 60, "delay": 0.2}})  # ~6 s, 5 events/s
        wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "RUNNING", 30, "RUNNING")
        page.goto(f"/#/runs/{run.run_id}")
        page.wait_for_function("() => { const f = " + FIG.format(kind="run") + "; return f && f.chart.uplot; }")
        reads: list[float] = []
        page.on("request", lambda r: reads.append(time.monotonic()) if "/system/charts/runs/" in r.url else None)
        runs: list[float] = []
        page.on("request", lambda r: runs.append(time.monotonic())
                if r.url.endswith(f"/system/runs/{run.run_id}") else None)
        page.wait_for_timeout(4000)
        assert len(runs) >= 4, f"the page did not follow the run live: {len(runs)} reads"
        assert len(reads) <= 3, f"{len(reads)} chart reads in 4 s (page refreshes: {len(runs)})"
        wait_db(panel_engine, "panel-slow", lambda r: r["status"] == "SUCCESS", 60, "SUCCESS")
    finally:
        context.close()
