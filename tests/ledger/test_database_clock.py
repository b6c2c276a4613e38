"""Every timestamp of the protocol comes from the database's clock, never from the client's.

The proof runs the protocol in a separate process whose clock is wrong by years (libfaketime), then
checks each timestamp against the database's own now().
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import TextClause, text

from scrinalia.domains.archive import ledger, registry

FAKETIME_LIBS = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
]

SKEWED_CLIENT = r"""
import json, sys, time, uuid, socket
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger, registry

engine = create_engine_from_url(sys.argv[1])
me = uuid.uuid4()
registry.register(engine, registry.RunnerRegistration(
    runner_id=me, name="skewed", hostname=socket.gethostname(), pid=1, package_version="t",
    schema_revision=None, capabilities=["embedding"], concurrency=1, heartbeat_seconds=5, lease_seconds=40))
queued = ledger.enqueue(engine, "embedding", {}, not_before_delay_s=0)
run = ledger.claim_next(engine, me, ["embedding"], 40)
beat = ledger.heartbeat(engine, me, 40)
done = ledger.finish(engine, run.run_id, me, ledger.FinishParams("SUCCESS"))
print(json.dumps({"client_time": time.time(), "run_id": str(run.run_id), "runner_id": str(me),
                  "claim_lease": run.lease_expires_at.isoformat(), "claim_start": run.started_at.isoformat()}))
"""


def _faketime_lib() -> str:
    for lib in FAKETIME_LIBS:
        if Path(lib).exists():
            return lib
    raise AssertionError("libfaketime is missing: `make test` installs the Debian package faketime")


def test_a_client_with_a_wrong_clock_gets_database_timestamps(database_url, engine):
    env = dict(os.environ, LD_PRELOAD=_faketime_lib(), FAKETIME="-3y", FAKETIME_DONT_FAKE_MONOTONIC="1")
    proc = subprocess.run([sys.executable, "-c", SKEWED_CLIENT, database_url], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    with engine.connect() as conn:
        db_now = conn.execute(text("SELECT now()")).scalar_one()
    client_now = datetime.fromtimestamp(out["client_time"], tz=UTC)
    assert db_now - client_now > timedelta(days=700), "the client's clock was not skewed"

    run = ledger.get_run(engine, __import__("uuid").UUID(out["run_id"]))
    window = timedelta(minutes=2)
    for stamp in (run.queued_at, run.started_at, run.heartbeat_at, run.finished_at, run.not_before):
        assert abs(db_now - stamp) < window, stamp
    lease = datetime.fromisoformat(out["claim_lease"]) - datetime.fromisoformat(out["claim_start"])
    assert lease == timedelta(seconds=40)
    assert (run.lease_expires_at - run.heartbeat_at) == timedelta(seconds=40)
    assert run.runner_id is not None
    runner = registry.get_runner(engine, run.runner_id)
    assert abs(db_now - runner.started_at) < window and abs(db_now - runner.last_heartbeat_at) < window


def _statements(module) -> list[TextClause]:
    return [value for value in vars(module).values() if isinstance(value, TextClause)]


@pytest.mark.parametrize("module", [ledger, registry], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_protocol_statement_binds_a_timestamp(module):
    """Structural guard: no bind parameter of a protocol statement is a time; intervals are seconds."""
    statements = _statements(module)
    assert statements
    for stmt in statements:
        for name in stmt._bindparams:
            assert not any(word in name for word in ("_at", "now", "time", "date", "until")), (name, stmt.text)
    source = inspect.getsource(module)
    tree = ast.parse(source)
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert not calls & {"now", "utcnow", "time", "today"}, calls & {"now", "utcnow", "time", "today"}
