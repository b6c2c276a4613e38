"""The panel's security headers in a real chromium: present on the panel and the API, framing refused
(also from another port of the same host, which is the same *site*, so SameSite cookies go along), and
no Content-Security-Policy violation while the panel's pages are walked (the ``page`` fixture fails a
test on any violation; here every screen is visited on purpose, and a positive control proves the
watcher sees one)."""
from __future__ import annotations

import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect
from sqlalchemy import text

from scrinalia.db.local_cluster import free_port
from tests.panel.helpers import ADMIN, login, shot, watch_csp

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REQUIRED = {
    "content-security-policy": "frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


@pytest.mark.parametrize("path", ["/", "/index.html", "/js/app.js", "/css/panel.css", "/api/v1/auth/me",
                                  "/healthz", "/api/v1/openapi.json", "/no/such/file", "/metrics"])
def test_security_headers_on_every_answer(live_api, path):
    r = httpx.get(f"{live_api}{path}", timeout=15)
    for name, value in REQUIRED.items():
        assert value in r.headers.get(name, ""), (path, r.status_code, name, dict(r.headers))
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp


@pytest.fixture
def other_origin(tmp_path: Path, live_api: str):
    """A page on another port of the same host that frames the panel, by IP and by host name."""
    api_port = live_api.rsplit(":", 1)[1]
    (tmp_path / "frame.html").write_text(
        "<!doctype html><title>framer</title>"
        f'<iframe id="by-ip" src="http://127.0.0.1:{api_port}/#/workers" width="800" height="400"></iframe>'
        f'<iframe id="by-name" src="http://localhost:{api_port}/#/workers" width="800" height="400"></iframe>'
    )
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port),
                                 partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/frame.html"
    server.shutdown()
    server.server_close()


def test_the_panel_does_not_render_in_a_frame_of_another_origin(browser, live_api, other_origin, panel_users):
    context = browser.new_context(base_url=live_api)
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        login(page, *ADMIN)  # a live session: the framed panel would show live Run buttons
        expect(page.get_by_role("heading", name="Workers")).to_be_visible()
        console: list[str] = []
        page.on("console", lambda msg: console.append(msg.text))
        page.goto(other_origin)
        assert len(page.frames) == 3, [f.url for f in page.frames]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sum("frame-ancestors" in m or "X-Frame-Options" in m
                                                  for m in console) < 2:
            time.sleep(0.1)
        shot(page, "security-framed")
        for frame in page.frames[1:]:
            # chromium replaces a refused frame by its own error document: no panel, no buttons
            assert not frame.url.startswith(live_api), frame.url
            assert frame.locator("button").count() == 0
            assert frame.locator("text=Workers").count() == 0
        assert sum("frame-ancestors" in m for m in console) >= 2, console
    finally:
        context.close()


def _seed_run_with_progress(engine) -> str:
    """A finished run with progress and an error, so the run page draws its bar and its sections."""
    from scrinalia.domains.archive import ledger

    run = ledger.enqueue(engine, "panel-slow", {}, trigger="API", requested_by="seed")
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE archive_worker_runs SET status = 'FAILED', started_at = now() - interval '1 minute', "
            "finished_at = now(), error = 'RuntimeError: seeded for the CSP walk', "
            "progress = CAST(:p AS jsonb) WHERE run_id = :id"),
            {"p": '{"done": 3, "total": 10, "unit": "document"}', "id": run.run_id})
    return str(run.run_id)


def test_walking_every_screen_reports_no_csp_violation(page, panel_engine, panel_users):
    run_id = _seed_run_with_progress(panel_engine)
    login(page, *ADMIN)
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    for route, heading in (("workers", "Workers"), ("runs", "Runs"), ("failures", "Failures"),
                           ("runners", "Runners"), (f"runs/{run_id}", None), ("password?voluntary=1", None)):
        page.goto(f"/#/{route}")
        if heading:
            expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        else:
            page.wait_for_load_state("networkidle")
        shot(page, "security-walk-" + route.replace("/", "-").replace("?", "-"))
    # the period selector kept its width without a style attribute
    page.goto("/#/failures")
    assert page.locator(".page-head .period").evaluate("el => getComputedStyle(el).minWidth") != "0px"
    # (the page fixture asserts, after this test, that no violation was reported)


def test_the_csp_watcher_sees_a_violation(browser, live_api):
    """Positive control: an inline style attribute is refused and reported."""
    context = browser.new_context(base_url=live_api)
    try:
        violations = watch_csp(context)
        page = context.new_page()
        page.goto("/#/login")
        page.evaluate("document.body.setAttribute('style', 'color: red')")
        deadline = time.monotonic() + 10
        while not violations and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert violations and any("style" in v for v in violations), violations
    finally:
        context.close()
