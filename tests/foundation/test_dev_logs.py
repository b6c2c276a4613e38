"""``make dev``'s log (issue 28 item 11): no alembic "setup plugin" lines at each scheduler start, no
transformers progress bars from the runner's children, and one form of run id (the short one, as the
panel shows it) in every relayed line. Real processes: the scheduler on the test's database, a child
that imports transformers with the environment ``scrinalia dev`` gives its processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

from scrinalia.cli import dev
from scrinalia.domains.archive.run_ids import short_id


def test_the_scheduler_starts_without_alembics_plugin_lines(database_url):
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scrinalia.cli.main", "scheduler", "run", "--interval", "0.2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the scheduler says which role it took: it has started
            lines.append(line)
            if "scheduler is" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    log = "".join(lines) + rest
    assert "scheduler is" in log, log
    assert "setup plugin" not in log and "alembic.runtime.plugins" not in log, log


def test_the_runners_children_draw_no_transformers_progress_bar():
    env = dev.child_env("postgresql://unused/scrinalia")
    probe = ("from transformers.utils import logging; "
             "print('bars', logging.is_progress_bar_enabled())")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bars False" in done.stdout


def test_every_relayed_line_names_a_run_by_its_short_id(capsys):
    run_id = uuid.uuid4()
    line = f"run {run_id} (embedding): SUCCESS; run_id={str(run_id).upper()} short {short_id(run_id)}"
    managed = dev.Managed("runner", [sys.executable, "-c", f"print({line!r})"], dict(os.environ))
    assert managed.proc.wait(30) == 0
    managed.reader.join(10)
    out = capsys.readouterr().out
    assert str(run_id) not in out and str(run_id).upper() not in out, out
    assert out.count(short_id(run_id)) == 3, out
