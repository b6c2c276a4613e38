"""Fingerprints that name the real cause (decision 0145): a worker that holds its batch transaction open
past lease/2 (the database's idle_in_transaction_session_timeout) fails with "the worker held its batch
transaction open longer than lease/2", not "the database stayed blocked for longer than the run's
lease"; tried a second time only (a child frozen and resumed deserves one), not for a whole lease."""
from __future__ import annotations

import json
import subprocess

import pytest
from sqlalchemy import text

from tests.runner import workers
from tests.runner.conftest import ROOT, RUNNER

pytestmark = pytest.mark.slow


def test_a_batch_held_open_past_lease_over_two_is_named_for_what_it_is(runner_env, engine):
    with engine.begin() as conn:
        conn.execute(text(workers.STAMPER_TABLE_SQL))
        conn.execute(text("INSERT INTO fence_units (worker) SELECT 'stamper-b' FROM generate_series(1, 5)"))
    # lease 4 s: the child's idle_in_transaction_session_timeout is 2 s; batch 1 sleeps 3 s inside its
    # transaction, every time it is tried.
    done = subprocess.run([*RUNNER, "run", "stamper-b", "--option", "hold_at=1", "--option", "hold=3",
                           "--lease", "4", "--heartbeat", "1", "--json"], cwd=ROOT, env=runner_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    row = json.loads(done.stdout)
    assert row["status"] == "FAILED", row
    error = row["error"]
    assert error.startswith("BatchHeldOpen: the worker held its batch transaction open longer than lease/2 "
                            "(2 s, the database's idle_in_transaction_session_timeout) during batch 1"), error
    assert row['error_fingerprint'].startswith(
        "batchheldopen: the worker held its batch transaction open longer than lease/<n>"), row['error_fingerprint']
    assert "stayed blocked" not in row['error']
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fence_units WHERE done_by IS NOT NULL")).scalar_one() == 0
