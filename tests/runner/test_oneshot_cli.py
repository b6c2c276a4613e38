"""``scrinalia-runner run``: the one-shot CLI, its exit codes and its Ctrl-C."""
from __future__ import annotations

import json
import signal
import subprocess

import pytest

from scrinalia.domains.archive import ledger
from tests.runner.conftest import ROOT, RUNNER, wait_for, wait_status

pytestmark = pytest.mark.slow

FAST = ("--heartbeat", "0.3", "--lease", "5")


def _run(env, *args, timeout=120):
    return subprocess.run([*RUNNER, "run", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_success_exits_0_with_the_options_parsed_as_json_scalars(runner_env, engine):
    done = _run(runner_env, "ok", "--option", "units=3", "--option", "label=hello", "--option", "flag=true",
                "--batch", "2", "--by", "carol", "--json", *FAST)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["status"] == "SUCCESS" and row["trigger"] == "CLI" and row["requested_by"] == "carol"
    assert row["request"] == {"db_batch_size": 2, "options": {"units": 3, "label": "hello", "flag": True}}
    assert row["options"] == {"units": 3, "label": "hello", "flag": True}
    assert row["result"] == {"processed": 3}


def test_failure_exits_1(runner_env):
    done = _run(runner_env, "raises", *FAST)
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "ValueError: boom" in done.stderr


def test_usage_errors_exit_2(runner_env):
    assert _run(runner_env, "no-such-worker", *FAST).returncode == 2
    assert _run(runner_env, "ok", "--option", "novalue", *FAST).returncode == 2
    assert _run(runner_env, "ok", "--batch", "0", *FAST).returncode == 2
    assert _run(runner_env, "ok", "--heartbeat", "5", "--lease", "5").returncode == 2


def test_a_busy_slot_exits_3(runner_env, engine):
    ledger.enqueue(engine, "ok", {})
    done = _run(runner_env, "ok", *FAST)
    assert done.returncode == 3 and "already has an active run" in done.stderr


def _start(env, *args):
    return subprocess.Popen([*RUNNER, "run", *args, *FAST], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _running_row(engine, worker, with_progress=True):
    def find():
        run = ledger.active_run(engine, worker)
        if run is None or run.status != "RUNNING":
            return None
        if with_progress and not (run.progress or {}).get("done"):
            return None
        return run

    return wait_for(find, 60, what=f"a RUNNING {worker} row")


def test_ctrl_c_once_cancels_cooperatively_and_exits_130(runner_env, engine):
    proc = _start(runner_env, "slow", "--option", "units=2000", "--option", "pause=0.05")
    try:
        run = _running_row(engine, "slow")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    row = ledger.get_run(engine, run.run_id)
    assert row.status == "CANCELLED" and row.exit_reason == "cancelled"
    assert row.cancel_requested_at is not None
    assert 0 < row.result["processed"] < 2000
    assert "CANCELLED" in out


def test_ctrl_c_twice_kills_the_run_interrupted_and_exits_130(runner_env, engine):
    proc = _start(runner_env, "hang")
    try:
        run = _running_row(engine, "hang", with_progress=False)
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: ledger.get_run(engine, run.run_id).cancel_requested_at, 30, what="the cancel request")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    row = wait_status(engine, run.run_id, "INTERRUPTED")
    assert row.exit_reason == "runner-stopped" and row.exit_signal == signal.SIGKILL
    assert row.error.startswith("RunnerStopped: interrupted by the operator")


def test_a_ner_run_takes_its_model_directory_from_the_command_line(runner_env, engine, tmp_path):
    """``--engine-option KEY=VALUE`` (or ``--request``, the API's JSON) reaches the engine, validated as
    the API validates: ``ner`` needs a model, which only the run request can give on a fresh install."""
    from tests.workers import tiny_models
    from tests.workers.helpers import insert_docs

    model = str(tiny_models.make_ner_model(tmp_path / "ner"))
    title = "Letters of Maria Joaquina to the Camara Municipal de Lisboa"
    insert_docs(engine, [{"reference_code": "N1", "title": title}])
    missing = _run(runner_env, "ner", *FAST)
    assert missing.returncode == 2 and "engine_options.model" in missing.stderr, missing.stderr
    dotted = _run(runner_env, "ner", "--option", f"engine_options.model={model}", *FAST)
    assert dotted.returncode == 2 and "--engine-option model=VALUE" in dotted.stderr, dotted.stderr
    done = _run(runner_env, "ner", "--engine-option", f"model={model}", "--preset", "cpu", "--json", *FAST,
                timeout=300)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["status"] == "SUCCESS" and row["request"] == {"preset": "cpu", "engine_options": {"model": model}}
    assert row["result"].get("links", 0) >= 3, row["result"]  # Maria Joaquina, Camara Municipal, Lisboa
    # The same request as JSON; a string for the engine's integer option is refused with the API's message.
    typed = _run(runner_env, "ner", "--request", json.dumps({"engine_options": {"model": model, "batch_size": "8"}}),
                 *FAST)
    assert typed.returncode == 2, typed.stderr
    assert "engine_options.batch_size: must be an integer, not a string ('8')" in typed.stderr
    flag = _run(runner_env, "ner", "--request", json.dumps({"engine_options": {"model": model}}),
                "--engine-option", "batch_size=8", "--preset", "cpu", "--json", *FAST, timeout=300)
    assert flag.returncode == 0, flag.stderr
    assert json.loads(flag.stdout)["request"]["engine_options"] == {"model": model, "batch_size": 8}
