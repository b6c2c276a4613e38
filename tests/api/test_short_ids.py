"""Run ids shown to people are unambiguous (decision 0143): four runs started within a minute have four
distinct short ids (the random tail of the UUIDv7), and a short id typed into the API or the CLI finds
its run; a prefix that several share is answered with the candidates, never with one of them."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
from sqlalchemy import Engine

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.run_ids import short_id, typed_run_id
from tests.api.conftest import add_user
from tests.api.live import REPO, live_api
from tests.api.test_hostile_live import _token


def _four_runs_now(engine: Engine) -> list:
    runs = []
    for _ in range(4):
        run = ledger.enqueue(engine, "alpha", {}, trigger="API")
        ledger.request_cancel(engine, run.run_id, "test")  # QUEUED: CANCELLED at once, the slot is free
        runs.append(run)
    return runs


def test_four_runs_in_a_minute_have_four_short_ids_that_find_them(database_url: str, engine: Engine) -> None:
    runs = _four_runs_now(engine)
    shorts = [short_id(r.run_id) for r in runs]
    assert len(set(shorts)) == 4 and all(len(s) == 12 for s in shorts), shorts
    heads = {r.run_id.hex[:8] for r in runs}
    assert len(heads) <= 2  # the old rule's 8 first digits: a clock, shared by runs of the same minute
    assert typed_run_id(" " + shorts[0].upper() + " ") == shorts[0]
    assert typed_run_id("xyz") is None and typed_run_id("abc") is None

    add_user(engine, "admin@example.org", "ADMIN")
    with live_api(database_url, workers=1) as api:
        headers = _token(api.base, "admin@example.org")
        with httpx.Client(base_url=api.base, headers=headers) as client:
            for run, short in zip(runs, shorts, strict=True):
                r = client.get(f"/api/v1/system/runs/{short}")
                assert r.status_code == 200 and r.json()["run_id"] == str(run.run_id), r.text
            head = runs[0].run_id.hex[:8]
            sharing = [str(r.run_id) for r in runs if r.run_id.hex[:8] == head]
            r = client.get(f"/api/v1/system/runs/{head}")
            if len(sharing) > 1:
                assert r.status_code == 409 and r.json()["error"] == "run_ids_ambiguous", r.text
                assert set(r.json()["run_ids"]) == set(sharing)
            else:
                assert r.status_code == 200
            assert client.get("/api/v1/system/runs/0123456789ab").status_code == 404
            assert client.get("/api/v1/system/runs/not-an-id").status_code == 422

    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    cli = subprocess.run([sys.executable, "-m", "scrinalia.cli.main", "runs", "show", shorts[2]],
                         capture_output=True, text=True, env=env, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith(f"run {shorts[2]} ({runs[2].run_id}) alpha: CANCELLED"), cli.stdout
    missing = subprocess.run([sys.executable, "-m", "scrinalia.cli.main", "runs", "show", "0123456789ab"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "no run 0123456789ab" in missing.stderr
