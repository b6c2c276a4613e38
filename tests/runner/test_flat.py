"""A daemon serves runs for days: what it keeps per run must leave with the run (issue 29, decision 0380).

A real supervisor (in this process, so its objects can be walked) with a real fork server and its children
serves runs of ``ok`` one after the other against the real PostgreSQL. After them, every object reachable
from the supervisor (its phases, its tables, its engine and the engine's caches, its launcher) is walked:
no row of a finished run and no finished run's id may be held, but for the newest ``FINISHED_KEPT`` rows
the finisher keeps for the one-shot CLI. No timing and no RSS is asserted: the structure is
(bench/bench_flat.py measures the memory over 20,000 runs).
"""
from __future__ import annotations

import gc
import os
import types
import uuid
from typing import Any

import pytest

from runner.database import check_schema, child_connect_args, parent_engine, registration
from runner.finisher import FINISHED_KEPT
from runner.forkserver import ForkServerLauncher
from runner.loop_state import ChildSetup
from runner.options import RunnerOptions
from runner.ports import Host
from runner.supervisor import Supervisor
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.workers.plugins import load_catalogue
from tests.runner.conftest import PLUGINS, ROOT

RUNS = 3 * FINISHED_KEPT + 2


@pytest.fixture(autouse=True)
def _plugins(monkeypatch):
    monkeypatch.setenv("SCRINALIA_WORKER_PLUGINS", PLUGINS)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _reachable(root: Any) -> list[Any]:
    """Every object reachable from ``root`` through references, not through modules, classes or
    functions (their globals would reach the whole interpreter)."""
    skip = (types.ModuleType, type, types.FunctionType, types.CodeType, types.BuiltinFunctionType)
    seen: set[int] = set()
    out: list[Any] = []
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        out.append(obj)
        stack.extend(gc.get_referents(obj))
    return out


def test_a_daemon_keeps_nothing_of_its_finished_runs(database_url, engine):
    options = RunnerOptions(name="flat", capabilities=("ok",), concurrency=1, heartbeat_seconds=1.0,
                            lease_seconds=10.0, poll_seconds=0.05).validate()
    sup_engine = parent_engine(database_url, options)
    sup = Supervisor(
        options, registration(options, ["ok"], kind="daemon", schema_revision=check_schema(sup_engine)),
        ForkServerLauncher((), title="scrinalia-runner: fork server (test_flat)", standby=True),
        ChildSetup(database_url, child_connect_args(None, options), load_catalogue(), sup_engine),
        host=Host(install_signals=False),
    )
    finished: list[uuid.UUID] = []
    try:
        sup.open()
        sup.heartbeat.beat()
        while len(finished) < RUNS:
            run = ledger.enqueue(engine, "ok", {"options": {"units": 1}})
            while sup.counters["SUCCESS"] + sup.counters["FAILED"] < len(finished) + 1:
                sup.tick()  # waits on the children, the fork server and the timers: no sleep
            finished.append(run.run_id)
        assert sup.counters["SUCCESS"] == RUNS, sup.counters

        # The tables of the loop hold nothing of a finished run.
        assert not sup.children and not sup.starts.unstarted and not sup.starts.waiting
        assert not sup.finisher.pending and not sup.finisher.abandoned
        assert list(sup.finished) == finished[-FINISHED_KEPT:]

        # Nor does anything else the supervisor reaches (its engine's caches included): a row or an id of
        # a finished run is only the finisher's newest FINISHED_KEPT.
        everything = _reachable(sup)
        rows = {obj.run_id for obj in everything if isinstance(obj, WorkerRun)}
        ids = {obj for obj in everything if isinstance(obj, uuid.UUID)}
        kept = set(finished[-FINISHED_KEPT:])
        assert rows <= kept, f"{len(rows - kept)} rows of older finished runs are still held"
        assert not (ids & set(finished)) - kept, f"{len((ids & set(finished)) - kept)} older run ids are held"
    finally:
        sup.close()
        sup_engine.dispose()
