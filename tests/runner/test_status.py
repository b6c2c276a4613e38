"""``scrinalia-runner status``, the supervisor that never imports torch, and secrets kept out of sight."""
from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from sqlalchemy.engine import make_url

from runner import control
from runner.options import RunnerOptions
from runner.procinfo import mapped_files
from runner.status import STATUS_FIELDS
from scrinalia.domains.archive import registry
from scrinalia.domains.archive.run_ids import short_id
from tests.runner.conftest import ROOT, RUNNER, enqueue, wait_for, wait_status

pytestmark = pytest.mark.slow

CHILD_FIELDS = {"pid", "run_id", "worker", "phase", "elapsed_seconds", "progress", "rss_bytes",
                "gpu_memory_bytes", "device", "cancel_requested"}


def _cli(env, *args):
    return subprocess.run([*RUNNER, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_parent_never_imports_torch_while_the_fork_server_preloads_it(start_runner, engine):
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", "--poll", "0.2", preload="torch,transformers")
    status = runner.status()
    assert status["launcher"]["start_method"] == "forkserver"
    assert status["launcher"]["preloaded"] == ["torch", "transformers"]
    run = enqueue(engine, "slow", units=20, pause=0.1)
    child = runner.child_for(run.run_id)

    def torch_libs(pid):
        return {f for f in mapped_files(pid) if "libtorch" in f}

    assert torch_libs(status["launcher"]["pid"]), "the fork server preloaded torch"
    assert torch_libs(child["pid"]), "a child is a fork of the preloaded fork server"
    assert not torch_libs(runner.pid), "the supervisor mapped libtorch"
    modules = control.query(runner.socket_path, {"command": "modules"})
    assert modules["pid"] == runner.pid
    assert modules["loaded"]["torch"] is False and modules["loaded"]["transformers"] is False
    assert wait_status(engine, run.run_id, "SUCCESS").metrics["child_ready_ms"] >= 0
    assert not torch_libs(runner.pid)


def test_status_shows_the_children_of_a_live_runner_and_json_has_the_documented_fields(
    start_runner, runner_env, engine, database_url
):
    secret = "s3cr3t-Pw-do-not-leak"
    url = make_url(database_url).set(password=secret).render_as_string(hide_password=False)
    env = dict(runner_env, DATABASE_URL=url)
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", "--poll", "0.2", "--concurrency", "2", env=env)
    runs = [enqueue(engine, "slow", units=200, pause=0.1), enqueue(engine, "hang")]
    for r in runs:
        runner.child_for(r.run_id)
    wait_for(lambda: any((c["progress"] or {}).get("done") for c in runner.children()), 20, what="progress")

    done = _cli(env, "status", "--socket", str(runner.socket_path), "--json")
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert isinstance(answers, list) and len(answers) == 1
    status = answers[0]
    assert set(status) == set(STATUS_FIELDS)
    assert status["name"] == runner.name and status["pid"] == runner.pid
    assert status["database"]["state"] == "ok"
    assert 0 < status["lease_margin_seconds"] <= 5
    assert status["uptime_seconds"] > 0
    effective = RunnerOptions(name="x", heartbeat_seconds=0.5, lease_seconds=5, poll_seconds=0.2).validate().timings
    assert status["timings"] == {name: dict(v) for name, v in effective.to_json().items()}  # the derivation
    assert {c["run_id"] for c in status["children"]} == {str(r.run_id) for r in runs}
    for c in status["children"]:
        assert set(c) == CHILD_FIELDS
        assert c["pid"] > 0 and c["elapsed_seconds"] > 0 and c["worker"] in ("slow", "hang")
        assert c["rss_bytes"] and c["rss_bytes"] > 0
        assert c["gpu_memory_bytes"] is None  # no GPU on the test machine
        assert c["device"] is None  # NVML lists no device here: the runner owns none
    slow = next(c for c in status["children"] if c["worker"] == "slow")
    assert slow["progress"]["total"] == 200
    # The child's process title shows the run, the worker and the progress.
    with open(f"/proc/{slow['pid']}/cmdline", "rb") as fh:
        title = fh.read().replace(b"\0", b" ").decode().strip()
    short = short_id(slow["run_id"])  # the random tail, as in the panel and the logs
    assert title.startswith(f"scrinalia-runner: run {short} slow batch "), title
    assert title.endswith("/200"), title
    with open(f"/proc/{runner.pid}/cmdline", "rb") as fh:
        assert fh.read().startswith(b"scrinalia-runner: supervisor " + runner.name.encode())

    text_out = _cli(env, "status", "--socket", str(runner.socket_path))
    assert text_out.returncode == 0
    for r in runs:
        assert short_id(r.run_id) in text_out.stdout
    assert "/200 units" in text_out.stdout, text_out.stdout  # the plural of the worker's unit
    assert "lease margin" in text_out.stdout and "database ok" in text_out.stdout
    assert "\ndatabase horizon: " in text_out.stdout  # the oldest xmin holder, read now (decision 0371)

    every = _cli(env, "status", "--all", "--json")
    assert every.returncode == 0, every.stderr
    rows = json.loads(every.stdout)
    mine = [r for r in rows if r["runner_id"] == status["runner_id"]]
    assert mine and mine[0]["state"] == "online" and mine[0]["kind"] == "daemon"
    assert len(mine[0]["children"]) == 2
    assert "online" in _cli(env, "status", "--all").stdout

    # The password reaches no log, no status, no registry row, no process title.
    snapshot = registry.get_runner(engine, uuid.UUID(status["runner_id"]))
    assert snapshot.devices == []  # NVML finds no GPU here: nothing, not an error
    assert snapshot.hostname and snapshot.schema_revision and snapshot.heartbeat_seconds == 0.5
    for text in (runner.log(), done.stdout, text_out.stdout, every.stdout, repr(snapshot)):
        assert secret not in text
    for c in status["children"] + [{"pid": runner.pid}, {"pid": status["launcher"]["pid"]}]:
        with open(f"/proc/{c['pid']}/cmdline", "rb") as fh:
            assert secret.encode() not in fh.read()


def test_status_without_a_runner_says_so(runner_env, tmp_path):
    done = _cli(runner_env, "status", "--socket", str(tmp_path / "none.sock"))
    assert done.returncode == 1 and "no runner answers" in done.stderr


def test_the_control_socket_is_private(start_runner):
    import os
    import stat

    runner = start_runner()
    assert stat.S_IMODE(os.stat(runner.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(runner.socket_path.parent).st_mode) & 0o077 == 0


def test_status_finds_the_systemd_runners_socket_and_says_where_it_looked(start_runner, runner_env, tmp_path):
    # an admin's login: its own XDG_RUNTIME_DIR (nothing there), the systemd runner's socket elsewhere
    user_dir = tmp_path / "xdg"
    (user_dir / "scrinalia-runner").mkdir(parents=True)
    system_dir = tmp_path / "run-scrinalia-runner"
    system_dir.mkdir(mode=0o700)
    env = {**runner_env, "XDG_RUNTIME_DIR": str(user_dir), "SCRINALIA_RUNNER_SYSTEM_DIR": str(system_dir)}
    env.pop("RUNTIME_DIRECTORY", None)

    nothing = _cli(env, "status")
    assert nothing.returncode == 1
    assert f"{user_dir / 'scrinalia-runner'}: 0 sockets" in nothing.stderr
    assert f"{system_dir}: 0 sockets" in nothing.stderr

    socket_path = system_dir / "gpu-host.sock"  # a later --socket wins over the fixture's own
    runner = start_runner("--heartbeat", "0.5", "--lease", "5", "--socket", str(socket_path), name="gpu-host",
                          wait=False)

    def answers():
        try:
            return control.query(socket_path, {"command": "status"}, timeout=1.0)
        except (OSError, ValueError):
            assert runner.proc.poll() is None, runner.log()
            return None

    wait_for(answers, 60, what="the runner's socket in the systemd directory")
    found = _cli(env, "status", "--json")
    assert found.returncode == 0, found.stderr
    (answer,) = json.loads(found.stdout)
    assert answer["pid"] == runner.pid


def test_status_names_the_oldest_holder_of_the_xmin_horizon(runner_env, engine):
    """Decision 0371: a REPEATABLE READ session left open (an analyst's psql) is why the ledger grows;
    ``status`` names it, with the database's own view of it."""
    from sqlalchemy import text

    with engine.connect() as holder:
        holder.execution_options(isolation_level="REPEATABLE READ")
        holder.execute(text("SET application_name = 'analyst-session'"))
        holder.execute(text("SELECT count(*) FROM archive_worker_runs"))  # its snapshot holds the xmin
        pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as other:  # transactions after its snapshot: its xmin is the oldest
            for _ in range(3):
                other.execute(text("SELECT pg_current_xact_id()"))
                other.commit()
        done = _cli(runner_env, "status", "--all")
        holder.rollback()
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("database horizon: "))
    assert f"by pid {pid} (analyst-session, idle in transaction)" in line, line
