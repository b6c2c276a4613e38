"""Live updates and pick-up on notification, measured side by side in one run (decisions 0080, 0081).

1. Pick-up latency: from the enqueue's commit (the client's wall clock when ``ledger.enqueue`` returned)
   to the worker's first line (``bench-stamp`` takes ``time.time()`` first thing), a real daemon at the
   default cadence (--heartbeat 15 --lease 60 --poll 2), with notifications and with --no-listen.
   The enqueues come at random moments, so the poll's phase is sampled fairly. Target with
   notifications: p50 <= 50 ms (claim + child ready).
2. Panel latency: from a ledger change (an enqueue, then its cancel, committed by this process) to the
   browser's DOM (a MutationObserver stamps ``Date.now()`` when the worker card's state changes), a
   real API (uvicorn) and headless chromium on this host (one clock). Target p50 and p95 <= 1 s.
3. Idle cost: statements per second that 10 idle runners put on the database (the database's own
   ``xact_commit + xact_rollback`` over a window; every protocol statement is one transaction), at the
   default cadence, with notifications and with --no-listen.

Run:  .venv/bin/python bench/bench_live.py [--pickup-samples 20] [--panel-samples 20] [--idle-window 40]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text

from bench._pg import bench_database, percentile
from bench.bench_runner import Daemon, _env, _wait_row
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger

DEFAULT_CADENCE = ("--heartbeat", "15", "--lease", "60", "--poll", "2", "--preload", "none")


def _summary(values: list[float]) -> dict[str, float]:
    return {"samples": len(values), "p50": round(percentile(values, 0.5), 1),
            "p95": round(percentile(values, 0.95), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def _wait_serving(engine, names: list[str], timeout: float = 180.0) -> None:
    """Every runner's loop runs: its first heartbeat came after its fork server was ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            n = conn.execute(text(
                "SELECT count(*) FROM archive_worker_runners WHERE name = ANY(:n) AND stopped_at IS NULL "
                "AND last_heartbeat_at > started_at"), {"n": names}).scalar_one()
        if n == len(names):
            return
        time.sleep(0.2)
    raise RuntimeError("the runners do not serve")


def pickup_latency(url, engine, tmp, listen: bool, samples: int,
                   extra: tuple[str, ...] = ()) -> tuple[list[float], list[float], list[float]]:
    name = f"pickup-{'listen' if listen else 'poll'}{'-' + extra[0].strip('-') if extra else ''}"
    flags = [*DEFAULT_CADENCE, "--capabilities", "bench-stamp", "--listen" if listen else "--no-listen", *extra]
    daemon = Daemon(url, tmp, name, *flags)
    try:
        _wait_serving(engine, [name])
        values, claims, ready = [], [], []
        for i in range(samples + 1):
            time.sleep(random.uniform(0.1, 2.1))  # a random phase against the 2 s poll
            run = ledger.enqueue(engine, "bench-stamp", {})
            committed = time.time()
            done = _wait_row(engine, run.run_id, ("SUCCESS", "FAILED"))
            assert done.status == "SUCCESS", done.error
            if i:  # the first one warms the caches
                values.append((done.result["first_line_at"] - committed) * 1000)
                claims.append((done.started_at.timestamp() - committed) * 1000)  # one host: one clock
                ready.append(done.metrics["child_ready_ms"])
        return values, claims, ready
    finally:
        daemon.stop()


def idle_statements(url, engine, tmp, listen: bool, runners: int, window: float) -> float:
    names = [f"idle-{'listen' if listen else 'poll'}-{i}" for i in range(runners)]
    daemons = []
    try:
        for name in names:
            daemons.append(Daemon(url, tmp, name, *DEFAULT_CADENCE, "--capabilities", "bench-noop",
                                  "--listen" if listen else "--no-listen"))
        _wait_serving(engine, names)
        time.sleep(12)  # past the start's own statements, and past PostgreSQL's 10 s stats flush delay
        before, t0 = _transactions(engine), time.monotonic()
        time.sleep(window)
        after, t1 = _transactions(engine), time.monotonic()
        return round((after - before) / (t1 - t0), 2)
    finally:
        for daemon in daemons:
            daemon.stop()


def _transactions(engine) -> int:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(conn.execute(text(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )).scalar_one())


def panel_latency(url, engine, samples: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    from scrinalia.cli.dev import wait_http
    from scrinalia.db.local_cluster import free_port
    from scrinalia.domains.identity import users

    email, password = "bench@live.test", "bench-password-123"
    users.create_user(engine, email, password, "ADMIN")
    port = free_port()
    env = _env(url)
    env.update(API_COOKIE_SECURE="false", API_LOGIN_RATE_LIMIT="1000")
    api = subprocess.Popen([sys.executable, "-m", "uvicorn", "scrinalia.api.app:create_app", "--factory",
                            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    values: list[float] = []
    try:
        if not wait_http(f"{base}/healthz", 60, alive=lambda: api.poll() is None):
            raise RuntimeError("the API did not start")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=os.environ.get("SCRINALIA_CHROMIUM", "/usr/bin/chromium"),
                                         headless=True, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(base_url=base)
            page.goto("/#/login")
            page.get_by_label("E-mail").fill(email)
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_selector('article[data-worker="bench-noop"]')
            page.wait_for_selector('body[data-live="on"]')
            page.evaluate("""() => {
              window.__changes = [];
              const card = document.querySelector('article[data-worker="bench-noop"]');
              new MutationObserver(() => {
                const last = window.__changes[window.__changes.length - 1];
                if (!last || last.state !== card.dataset.state)
                  window.__changes.push({ t: Date.now(), state: card.dataset.state });
              }).observe(card, { attributes: true, attributeFilter: ['data-state'] });
            }""")
            for _ in range(samples):
                time.sleep(random.uniform(0.2, 0.6))
                run = ledger.enqueue(engine, "bench-noop", {})
                values.append(_seen(page, "queued", time.time()))
                time.sleep(random.uniform(0.2, 0.6))
                ledger.request_cancel(engine, run.run_id, "bench")
                values.append(_seen(page, "idle", time.time()))
            browser.close()
    finally:
        api.terminate()
        api.wait(30)
    return values


def _seen(page, state: str, committed: float, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        changes = page.evaluate("window.__changes.splice(0)")
        for change in changes:
            if change["state"] == state:
                return change["t"] - committed * 1000
        time.sleep(0.01)
    raise RuntimeError(f"the page did not show {state}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pickup-samples", type=int, default=20)
    parser.add_argument("--panel-samples", type=int, default=20)
    parser.add_argument("--idle-runners", type=int, default=10)
    parser.add_argument("--idle-window", type=float, default=40)
    args = parser.parse_args()
    results: dict = {"host": socket.gethostname(), "cpus": os.cpu_count()}
    with bench_database("bench_live") as url, tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        engine = create_engine_from_url(url)
        results["pickup_ms"] = {}
        for label, listen in (("notifications", True), ("poll_only_2s", False)):
            first_line, claim, ready = pickup_latency(url, engine, tmp, listen, args.pickup_samples)
            results["pickup_ms"][label] = {**_summary(first_line), "claim_p50": round(percentile(claim, 0.5), 1),
                                           "child_ready_p50": round(percentile(ready, 0.5), 1)}
        results["panel_latency_ms"] = _summary(panel_latency(url, engine, args.panel_samples))
        results["idle_statements_per_s"] = {
            "runners": args.idle_runners, "window_s": args.idle_window,
            "notifications": idle_statements(url, engine, tmp, True, args.idle_runners, args.idle_window),
            "poll_only_2s": idle_statements(url, engine, tmp, False, args.idle_runners, args.idle_window),
        }
        engine.dispose()
    results["targets"] = {
        "pickup_p50_le_50ms": results["pickup_ms"]["notifications"]["p50"] <= 50,
        "panel_p50_le_1s": results["panel_latency_ms"]["p50"] <= 1000,
        "panel_p95_le_1s": results["panel_latency_ms"]["p95"] <= 1000,
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
