"""Screenshots of the panel for docs/operations.md ("The panel"): the worker, run, runners and schedules
pages at 1280 and 390 px, on a fresh install and after a day of history, in docs/img/panel-*.png.

Everything is real: a throwaway PostgreSQL (bench/_pg.py), the API (uvicorn), a runner daemon that runs
the panel tests' slow worker, and headless chromium. The day of history is made through the ledger's own
steps (enqueue, claim, finish) and then dated back over 24 h, as tests/panel/test_charts.py does.

    .venv/bin/python scripts/panel_screenshots.py [--out docs/img]

Viewport screenshots (not whole pages) at a device scale of 1: about 50-150 KB each.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, text

from scrinalia.domains.archive.ledger import FinishParams

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._pg import bench_database  # noqa: E402
from scrinalia.cli.dev import wait_http  # noqa: E402
from scrinalia.db.engine import create_engine_from_url  # noqa: E402
from scrinalia.db.local_cluster import free_port  # noqa: E402
from scrinalia.domains.archive import ledger  # noqa: E402
from scrinalia.domains.identity import users  # noqa: E402

ADMIN = ("admin@example.org", "screenshots-password-1")
WORKER = "panel-slow"
RUNNER = "gpu-host-1"
WIDTHS = {1280: 900, 390: 844}
CHROMIUM = os.environ.get("SCRINALIA_CHROMIUM", "/usr/bin/chromium")


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DATABASE_URL=url, SCRINALIA_WORKER_PLUGINS="tests.panel.panel_workers:WORKERS",
               PYTHONPATH=str(REPO), API_COOKIE_SECURE="false", PYTHONUNBUFFERED="1")
    return env


def _wait(engine: Engine, sql: str, params: dict, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(text(sql), params).scalar_one():
                return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for: {sql}")


def _run(engine: Engine, options: dict) -> str:
    run = ledger.enqueue(engine, WORKER, {"options": options}, trigger="API", requested_by=ADMIN[0])
    _wait(engine, "SELECT count(*) FROM archive_worker_runs WHERE run_id = :r AND finished_at IS NOT NULL",
          {"r": run.run_id})
    return str(run.run_id)


def _day_of_history(engine: Engine) -> None:
    """About 60 runs of the slow worker over the last 24 h on the daemon's runner, most of them successful."""
    with engine.connect() as conn:
        runner_id = conn.execute(text("SELECT runner_id FROM archive_worker_runners WHERE name = :n "
                                      "AND stopped_at IS NULL"), {"n": RUNNER}).scalar_one()
    rng = random.Random(28)
    for i in range(60):
        # claimed as a worker the daemon does not run (it would race us for it), then named the slow one
        ledger.enqueue(engine, "panel-model", {}, trigger="SCHEDULE")
        run = ledger.claim_next(engine, runner_id, ["panel-model"], 60)
        assert run is not None
        outcome = rng.choices(["SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"], [85, 8, 4, 3])[0]
        ledger.finish(engine, run.run_id, runner_id, FinishParams(outcome))
        age = 24 * 3600 * (i + rng.random()) / 60
        seconds = rng.uniform(40, 400)
        with engine.begin() as conn:
            conn.execute(text(
                "UPDATE archive_worker_runs SET worker_name = :w, started_at = now() - make_interval(secs => :a), "
                "finished_at = now() - make_interval(secs => :f), duration_ms = :ms WHERE run_id = :r"),
                {"w": WORKER, "a": age + seconds, "f": age, "ms": int(seconds * 1000), "r": run.run_id})


def _schedules(engine: Engine, quarantined: bool) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_worker_schedules"))
        conn.execute(text("INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at) "
                          "VALUES (:w, 3600, '{}', now() + interval '40 minutes')"), {"w": WORKER})
        if quarantined:
            failed = ledger.enqueue(engine, "panel-flaky", {}, trigger="SCHEDULE")
            fp = conn.execute(text(
                "UPDATE archive_worker_runs SET status = 'FAILED', started_at = now() - interval '2 minutes', "
                "finished_at = now() - interval '1 minute', exit_reason = 'exception', "
                "error = 'FileNotFoundError: model_dir /srv/models/ner_v2 has no config.json' "
                "WHERE run_id = :r RETURNING error_fingerprint"), {"r": failed.run_id}).scalar_one()
            conn.execute(text(
                "INSERT INTO archive_worker_schedules (worker_name, interval_seconds, request, next_run_at, enabled, "
                "last_tick_at, last_run_id, last_outcome, quarantined_at, quarantine_reason, quarantine_fingerprint, "
                "quarantine_run_id) VALUES ('panel-flaky', 900, '{}', now(), false, now() - interval '2 minutes', "
                ":r, 'enqueued', now(), '3 retry chains in a row ended FAILED with one error', :f, :r)"),
                {"r": failed.run_id, "f": fp})


def _shoot(browser, base: str, out: Path, stage: str, run_id: str) -> list[Path]:
    made = []
    for width, height in WIDTHS.items():
        context = browser.new_context(base_url=base, viewport={"width": width, "height": height},
                                      device_scale_factor=1, color_scheme="light", reduced_motion="reduce")
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto("/#/login")
        page.get_by_label("E-mail").fill(ADMIN[0])
        page.get_by_label("Password").fill(ADMIN[1])
        page.get_by_role("button", name="Log in").click()
        page.get_by_role("heading", name="Workers", level=1).wait_for()
        for name, url, ready in (
            ("worker", f"/#/workers/{WORKER}", "figure[data-chart='durations']"),
            ("run", f"/#/runs/{run_id}", "figure[data-chart='run'] canvas"),
            ("runners", "/#/runners", "figure[data-chart='runner-slots']"),
            ("schedules", "/#/schedules", "table.schedules"),
        ):
            page.goto(url)
            page.locator(ready).first.wait_for()
            page.wait_for_load_state("networkidle")
            path = out / f"panel-{name}-{stage}-{width}.png"
            page.screenshot(path=str(path), full_page=False)
            made.append(path)
        context.close()
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with bench_database("shots") as url:
        engine = create_engine_from_url(url)
        users.create_user(engine, ADMIN[0], ADMIN[1], "ADMIN")
        port = free_port()
        logs = Path(tempfile.mkdtemp(prefix="scrinalia-shots-"))
        api = subprocess.Popen([sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
                                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                               env=_env(url), cwd=REPO, stdout=open(logs / "api.log", "wb"), stderr=subprocess.STDOUT)
        runner = subprocess.Popen([sys.executable, "-m", "runner.cli", "daemon", "--name", RUNNER,
                                   "--capabilities", "panel-slow,panel-crash", "--concurrency", "2",
                                   "--heartbeat", "1", "--lease", "6", "--poll", "0.5",
                                   "--socket", str(logs / "runner.sock")],
                                  env=_env(url), cwd=REPO, stdout=open(logs / "runner.log", "wb"),
                                  stderr=subprocess.STDOUT)
        made: list[Path] = []
        try:
            base = f"http://127.0.0.1:{port}"
            if not wait_http(f"{base}/healthz", 60, alive=lambda: api.poll() is None):
                raise SystemExit(f"the API did not start: {(logs / 'api.log').read_text()[-2000:]}")
            _wait(engine, "SELECT count(*) FROM archive_worker_runners WHERE name = :n AND stopped_at IS NULL "
                  "AND last_heartbeat_at > started_at", {"n": RUNNER})
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                            args=["--no-sandbox", "--disable-gpu"])
                # A fresh install: its first run, one schedule, nothing else.
                first = _run(engine, {"units": 40, "delay": 0.25, "load": 2})
                _schedules(engine, quarantined=False)
                made += _shoot(browser, base, args.out, "fresh", first)
                # After a day: 60 runs over 24 h, a quarantined schedule, a longer latest run.
                _day_of_history(engine)
                _schedules(engine, quarantined=True)
                latest = _run(engine, {"units": 120, "delay": 0.2})
                made += _shoot(browser, base, args.out, "day", latest)
                browser.close()
        finally:
            runner.terminate()
            api.terminate()
            runner.wait(30)
            api.wait(30)
            engine.dispose()
    for path in made:
        print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}  {path.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
