"""`make dev` from a fresh copy of the working tree: it starts, runs `embedding` on the demo collection
through the API, stops cleanly on Ctrl-C, and a second `make dev` reuses the data.

How it runs against the working tree (not only what is committed): the files git knows or would add
(``git ls-files --cached --others --exclude-standard``) are copied into a temporary directory, which is
what a fresh clone of this tree would hold. ``make dev`` runs there with ``VENV`` pointing at this
checkout's virtualenv (no reinstall of torch; ``-o`` keeps make from refreshing the install stamp), and
``PYTHONPATH`` puts the copy's packages before the editable install, so the copy's code is what runs.
Its private PostgreSQL lives in the copy's ``.scrinalia/``.

With ``SCRINALIA_UPDATE_DOCS_IMG=1`` the panel's screenshot taken here (the real catalogue, the demo
collection, `embedding` running) also replaces ``docs/img/panel.png``.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.panel.helpers import ARTIFACTS, REPO

pytestmark = [pytest.mark.slow, pytest.mark.browser]

VENV = Path(sys.prefix)
PASSWORD = "first-password-1"
NEW_PASSWORD = "my-own-password-2"


def copy_working_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


class MakeDev:
    def __init__(self, cwd: Path, port: int, log_name: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "MAKEFLAGS", "MFLAGS")}
        env.update(
            PYTHONPATH=str(cwd), SCRINALIA_DEV_PORT=str(port), SCRINALIA_ADMIN_PASSWORD=PASSWORD, NO_COLOR="1",
            API_LOGIN_RATE_LIMIT="1000",
        )
        argv = ["make", "-o", f"{VENV}/.installed", "dev", f"VENV={VENV}"]
        self.lines: list[str] = []
        self.log = open(ARTIFACTS / log_name, "w")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            self.log.flush()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.output)
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not seen within {timeout} s:\n{self.output[-4000:]}")

    def interrupt(self, timeout: float = 90) -> int:
        """Ctrl-C, as a terminal sends it: SIGINT to make's whole foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"make dev did not stop within {timeout} s:\n{self.output[-4000:]}") from None
        self.reader.join(5)
        self.log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.interrupt()


def wait_run(client: httpx.Client, run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    run = None
    while time.monotonic() < deadline:
        run = client.get(f"/api/v1/system/runs/{run_id}").json()
        if run["status"] not in ("QUEUED", "RUNNING"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not end within {timeout} s: {run}")


@pytest.fixture
def clone_dir():
    """A directory outside pytest's tmp root: PostgreSQL runs as `postgres` and must reach it through every
    parent, and pytest resets /tmp/pytest-of-<user> to 0700 whenever any pytest session starts."""
    path = Path(tempfile.mkdtemp(prefix="scrinalia-makedev-"))
    os.chmod(path, 0o755)
    yield path / "scrinalia"
    shutil.rmtree(path, ignore_errors=True)


def test_make_dev_from_a_fresh_copy_runs_embedding(clone_dir, browser):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    clone = clone_dir
    copy_working_tree(clone)
    assert not (clone / ".scrinalia").exists() and not (clone / ".venv").exists()
    from scrinalia.db.local_cluster import free_port

    port = free_port()
    dev = MakeDev(clone, port, "make-dev-1.log")
    try:
        url = dev.wait_for(r"Scrinalia is running:\s+(http://\S+)", 180).group(1)
        assert url == f"http://localhost:{port}/"
        out = dev.output
        assert "api    | " in out
        assert f"password:  {PASSWORD}" in out  # printed once
        assert "demo collection: " in out and "new documents" in out
        # the other CLIs get the database from the printed line (trust auth on 127.0.0.1: no password)
        export = re.search(r"export DATABASE_URL=(\S+)", out).group(1)
        assert "@127.0.0.1:" in export and ":***@" not in export
        listed = subprocess.run([str(VENV / "bin" / "scrinalia"), "scheduler", "list"], cwd=clone, capture_output=True,
                                text=True, timeout=60, env={**os.environ, "DATABASE_URL": export})
        assert listed.returncode == 0, listed.stderr
        # a fresh setup has no model directory: make dev says which worker needs one, and where to set it
        assert "ner needs a model: set engine_options.model in the panel (Workers > ner > Settings)" in out
        dev.wait_for(r"runner \| .*registered", 60)

        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/").status_code == 200 and "Scrinalia" in client.get("/").text
            login = client.post("/api/v1/auth/login", json={"email": "admin@scrinalia.local", "password": PASSWORD,
                                                             "issue_token": True})
            assert login.status_code == 200, login.text
            assert login.json()["must_change_password"] is True
            client.headers["Authorization"] = f"Bearer {login.json()['token']}"
            # The first login must choose a password before anything else.
            assert client.get("/api/v1/system/workers").status_code == 403
            r = client.post("/api/v1/auth/change-password",
                            json={"current_password": PASSWORD, "new_password": NEW_PASSWORD})
            assert r.status_code == 204, r.text
            workers = client.get("/api/v1/system/workers").json()
            embedding = next(w for w in workers["workers"] if w["name"] == "embedding")
            assert embedding["counts"]["pending"] >= 150, embedding["counts"]
            assert embedding["runners"], "no online runner advertises embedding"

            r = client.post("/api/v1/system/workers/embedding/runs", json={"db_batch_size": 8})
            assert r.status_code == 201, r.text
            run_id = r.json()["run_id"]
            screenshot_panel(browser, base, port)
            run = wait_run(client, run_id, 180)
            assert run["status"] == "SUCCESS", run
            assert run["progress"]["done"] == run["progress"]["total"] >= 150
            after = next(w for w in client.get("/api/v1/system/workers").json()["workers"] if w["name"] == "embedding")
            assert after["last_run"]["run_id"] == run_id
            assert after["counts"]["pending"] == 0  # counts are live (decision 0033): the queue is drained

            # every other demo worker runs on a fresh setup with no model directory; ner says why it cannot
            for name in ("typology", "quality-validator", "cleaning", "gpu-probe"):
                r = client.post(f"/api/v1/system/workers/{name}/runs", json={})
                assert r.status_code == 201, (name, r.text)
                done = wait_run(client, r.json()["run_id"], 240)
                assert done["status"] == "SUCCESS", (name, done)
            refused = client.post("/api/v1/system/workers/ner/runs", json={})
            assert refused.status_code == 422
            assert "Workers > ner > Settings" in refused.json()["fields"]["engine_options.model"]
            assert client.get("/api/v1/system/runs", params={"worker": "ner"}).json()["runs"] == []
    except BaseException:
        dev.kill()
        raise

    dev.interrupt()
    out = dev.output
    assert "all stopped" in out, out[-3000:]
    assert "stopping PostgreSQL" in out and "left running" not in out
    assert "runner stopped" in out and "api stopped" in out
    assert not (clone / ".scrinalia" / "pgdata" / "postmaster.pid").exists(), "PostgreSQL is still running"

    # A second `make dev` reuses the data: no new admin, no second demo load, the run is still there.
    dev2 = MakeDev(clone, port, "make-dev-2.log")
    try:
        dev2.wait_for(r"Scrinalia is running:", 180)
        out2 = dev2.output
        assert "exists already" in out2 and PASSWORD not in out2
        assert "demo collection already loaded" in out2
        assert "existing data" in out2
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            login = client.post("/api/v1/auth/login", json={"email": "admin@scrinalia.local",
                                                             "password": NEW_PASSWORD, "issue_token": True})
            assert login.status_code == 200, login.text
            client.headers["Authorization"] = f"Bearer {login.json()['token']}"
            runs = client.get("/api/v1/system/runs", params={"worker": "embedding"}).json()["runs"]
            assert [r["run_id"] for r in runs] == [run_id]

            # a run in progress, then Ctrl-C twice: the second one stops now instead of waiting the drain
            from sqlalchemy import text as sql

            from scrinalia.db.engine import create_engine_from_url

            engine = create_engine_from_url(export)
            try:
                with engine.begin() as conn:
                    conn.execute(sql("UPDATE archive_documents SET execution_log = execution_log - 'embedding'"))
            finally:
                engine.dispose()
            long_run = client.post("/api/v1/system/workers/embedding/runs", json={"db_batch_size": 1}).json()["run_id"]
            deadline = time.monotonic() + 120
            while client.get(f"/api/v1/system/runs/{long_run}").json()["status"] != "RUNNING":
                assert time.monotonic() < deadline, "the run did not start"
                time.sleep(0.3)
    except BaseException:
        dev2.kill()
        raise
    os.killpg(dev2.proc.pid, signal.SIGINT)
    dev2.wait_for(r"stopping everything", 30)
    started = time.monotonic()
    dev2.interrupt(timeout=60)
    assert time.monotonic() - started < 25, "the second Ctrl-C did not stop now"
    assert "again: stopping now" in dev2.output and "all stopped" in dev2.output, dev2.output[-3000:]


def screenshot_panel(browser, base: str, port: int) -> None:
    """The README's picture: the real catalogue with `embedding` running on the demo collection.
    ``browser``: the session's (a second sync Playwright in one thread is refused while it runs)."""
    from playwright.sync_api import expect

    context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 860}, color_scheme="light")
    try:
        page = context.new_page()
        page.goto("/#/login")
        page.get_by_label("E-mail").fill("admin@scrinalia.local")
        page.get_by_label("Password").fill(NEW_PASSWORD)
        page.get_by_role("button", name="Log in").click()
        card = page.locator('article[data-worker="embedding"]')
        deadline = time.monotonic() + 60
        while card.get_attribute("data-state") != "running" and time.monotonic() < deadline:
            page.evaluate("window.dispatchEvent(new Event('focus'))")
            page.wait_for_timeout(1000)
        try:  # best effort: on a loaded machine the run may end before its progress shows
            expect(card.get_by_role("progressbar")).to_have_attribute(
                "aria-valuenow", re.compile(r"^[1-9]"), timeout=20_000)
        except AssertionError:
            pass
        page.wait_for_timeout(300)
        path = ARTIFACTS / "make-dev-panel.png"
        page.screenshot(path=str(path))
        if os.environ.get("SCRINALIA_UPDATE_DOCS_IMG") == "1":
            target = REPO / "docs" / "img" / "panel.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    finally:
        context.close()
