"""Table growth per job while a REPEATABLE READ session pins the xmin horizon: the ledger with the previous
release's ``record_start`` (the configuration in the run's row, as migration 0021 and before kept it), at
head (the configuration in a row of its own, 0022), and Procrastinate, side by side in one run.

A private PostgreSQL 15 cluster (``bench/_pg.py``), a database per side, each ledger migrated to head; the
peer's in its own venv (``bench/peer_xmin.py``, ``--peer-python``). On each ledger, a runner registers as a
daemon on a GPU host does (its device, the model directories it sees, its warm models: ``DEVICES``,
``SEES``, ``WARM``; heartbeat 0.5 s, lease 4 s) and runs ``--jobs`` jobs one at a time through the
runner's own statements: enqueue, claim, record_start (the embedding worker's resolved configuration and
options, ~1 KB, as a real run writes), ``--beats`` heartbeats (the registry renewed with the child's
snapshot, the run's lease and progress), one record_progress, finish; a scrape's fold
(``archive_run_totals_fold()``) every ``--scrape-every`` jobs.
Before the jobs: ``--warmup`` jobs, VACUUM, the sizes; then a REPEATABLE READ session in that database
takes its snapshot and stays open (VACUUM can remove no version written after it; the horizon is per
database), the jobs run, VACUUM, the sizes again. Growth: pg_total_relation_size (heap, indexes, TOAST) of
the ledger's tables, per job, and per table; and pgstattuple's live and dead heap bytes (what the ledger keeps
against the versions only the pinned snapshot keeps). Hot rows: the registry row (one per heartbeat), the
run's row (claim, start, each beat, the progress, the finish).
The peer keeps the same cadence: its worker renews its row every ``--peer-heartbeat`` seconds and each of
its jobs lasts ``--beats`` of them. Two runs at different ``--beats`` give the cost of a beat (the slope)
and of a job without one; ``--steps-sweep`` adds head ledgers whose jobs make the runner's writes one more at
a time (``STEPS``), from enqueue, claim and finish alone: what each write of a job costs.
Run: .venv/bin/python bench/bench_xmin.py --peer-python /tmp/peers-venv/bin/python [--jobs 300] [--beats 2]
     [--steps-sweep]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench._pg import bench_database, create_extensions, run_peer
from runner.claims import _record_start_fields
from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.workers.catalogue import EMBEDDING
from scrinalia.domains.archive.workers.sdk import resolve_config

TABLES = ("archive_worker_runs", "archive_worker_run_configs", "archive_worker_runners",
          "archive_worker_runner_reports", "archive_run_totals", "archive_run_totals_watermark",
          "archive_worker_run_samples")
WORKERS = [f"worker-{i}" for i in range(4)]
HEARTBEAT_S, LEASE_S = 0.5, 4.0


def _sizes(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text("SELECT COALESCE(pg_total_relation_size(to_regclass(:t)), 0)"),
                                    {"t": t}).scalar_one()) for t in TABLES}


def _heap(engine) -> dict[str, dict[str, int]]:
    """Each table's heap in pgstattuple's words: the bytes of live tuples, of dead ones (a version that a
    later one replaced, kept for the pinned snapshot: under a pin, VACUUM counts it dead and cannot remove
    it) and of free space. Where pgstattuple is missing, nothing."""
    with engine.connect() as conn:
        if conn.execute(text("SELECT count(*) FROM pg_extension WHERE extname = 'pgstattuple'")).scalar_one() == 0:
            return {}
        return {t: dict(conn.execute(text("SELECT tuple_len AS live, dead_tuple_len AS dead, free_space AS free "
                                          "FROM pgstattuple(:t)"), {"t": t}).mappings().one())
                for t in TABLES if conn.execute(text("SELECT to_regclass(:t)"), {"t": t}).scalar_one()}


def _vacuum(engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for t in TABLES:
            if conn.execute(text("SELECT to_regclass(:t)"), {"t": t}).scalar_one() is not None:
                conn.execute(text(f"VACUUM {t}"))


#: What a job's ``record_start`` writes: the embedding worker's resolution with its defaults (~1 KB of
#: configuration and options, as a real run writes; before 2026-12-08 the bench wrote none).
START = _record_start_fields(resolve_config(EMBEDDING, None, {}))
#: The previous release's ``record_start`` (migration 0021 and before): the configuration in the run's row.
_START_IN_ROW = text("UPDATE archive_worker_runs SET engine_name = :engine_name, preset = :preset, "
                     "config = CAST(:config AS jsonb), options = CAST(:options AS jsonb) "
                     "WHERE run_id = :run_id AND runner_id = :runner_id AND status = 'RUNNING'")
#: What a daemon on a GPU host reports of it (``runner.devices``, ``model_dirs.seen_model_dirs``, the fork
#: server's warm models; before 2026-12-08 the bench registered none): at registration, and the warm models
#: by the first heartbeat.
DEVICE = {"index": 0, "uuid": "GPU-8f3c2a1e-5b7d-4c9a-a1e2-3f4b5c6d7e8f", "name": "NVIDIA H100 80GB HBM3"}
DEVICES = [{**DEVICE, "memory_total_bytes": 85520809984, "driver": "550.54.15", "slots": 1}]
SEES = {"model_dirs": ["/srv/models/all-MiniLM-L6-v2", "/srv/models/nli-deberta-v3-base",
                       "/srv/models/ner-camembert-base"], "model_roots": ["/srv/models"]}
WARM = {"models": [{"model_class": "AutoModel", "model_dir": "/srv/models/all-MiniLM-L6-v2", "dtype": "float32",
                    "bytes": 90868224, "load_seconds": 1.42, "workers": ["embedding", "typology"]}],
        "bytes": 90868224, "limit_bytes": 4294967296, "errors": []}
STEPS = ("start", "progress", "beats", "idle")  # a job's writes after its enqueue and claim, before its finish


def _record_start(engine, run_id: uuid.UUID, runner_id: uuid.UUID, in_row: bool) -> None:
    if not in_row:
        assert ledger.record_start(engine, run_id, runner_id, START)
        return
    with engine.begin() as conn:
        conn.execute(_START_IN_ROW, {"run_id": run_id, "runner_id": runner_id, "engine_name": START.engine_name,
                                     "preset": START.preset, "config": json.dumps(START.config),
                                     "options": json.dumps(START.options)})


def _child(i: int, run: ledger.WorkerRun, beat: int) -> dict[str, Any]:
    """The supervisor's snapshot of a job's child at a beat: its elapsed time and memory change each time."""
    return {"pid": 1000 + i, "run_id": str(run.run_id), "worker": run.worker_name, "phase": "batch",
            "elapsed_seconds": round(beat * HEARTBEAT_S, 3), "progress": {"done": beat, "total": 2000},
            "rss_bytes": 734003200 + 4096 * beat, "gpu_memory_bytes": 1288490188, "device": DEVICE,
            "cancel_requested": False}


def _jobs(engine, runner_id: uuid.UUID, n: int, beats: int, scrape_every: int,
          steps: tuple[str, ...] = STEPS, config_in_row: bool = False) -> list[tuple[float, float]]:
    """Run ``n`` jobs; each job's (seconds for the whole cycle, median seconds of its heartbeats, or of the
    cycle without any). ``steps``: which of the runner's writes a job makes besides enqueue, claim and finish
    (the three no queue with a claim does without): ``start`` record_start, ``progress`` the last
    record_progress and the finish's progress, ``beats`` the heartbeats (the run's lease and progress, the
    registry's children: a snapshot that changes each beat), ``idle`` the beat after the child (the children
    cleared)."""
    timings = []
    for i in range(n):
        worker = WORKERS[i % len(WORKERS)]
        started = time.perf_counter()
        ledger.enqueue(engine, worker, {})
        run = ledger.claim_next(engine, runner_id, WORKERS, LEASE_S)
        assert run is not None
        if "start" in steps:
            _record_start(engine, run.run_id, runner_id, config_in_row)
        beat_seconds = []
        for b in range(beats if "beats" in steps else 0):
            t = time.perf_counter()
            ledger.heartbeat(engine, runner_id, LEASE_S, progress={run.run_id: {"done": b, "total": beats}},
                             children=[_child(i, run, b)])
            beat_seconds.append(time.perf_counter() - t)
        final = {"done": beats, "total": beats} if "progress" in steps else None
        if final is not None:
            ledger.record_progress(engine, runner_id, {run.run_id: final})
        ledger.finish(engine, run.run_id, runner_id, ledger.FinishParams("SUCCESS", progress=final))
        if "idle" in steps:
            t = time.perf_counter()
            ledger.heartbeat(engine, runner_id, LEASE_S, children=[])  # the idle beat after the child exits
            beat_seconds.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
        timings.append((elapsed, statistics.median(beat_seconds) if beat_seconds else elapsed))
        if scrape_every and (i + 1) % scrape_every == 0:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("SELECT archive_run_totals_fold()"))
    return timings


def _slowdown(timings: list[tuple[float, float]], window: int = 50) -> dict[str, float]:
    """The median job cycle and heartbeat of the first and the last ``window`` jobs under the pin, in ms:
    what the versions the pin keeps cost the statements that must step over them (the hot rows' chains)."""
    out = {}
    for name, part in (("first", timings[:window]), ("last", timings[-window:])):
        out[f"job_{name}_ms"] = round(statistics.median(j for j, _ in part) * 1000, 2)
        out[f"beat_{name}_ms"] = round(statistics.median(b for _, b in part) * 1000, 2)
    return out


def ledger_side(url: str, label: str, args: Any, steps: tuple[str, ...] = STEPS,
                storage: dict[str, int] | None = None, config_in_row: bool = False) -> dict[str, Any]:
    """One ledger's growth under the pin; ``storage``: parameters set on the runs and the registry first
    (``fillfactor``, ``toast_tuple_target``)."""
    engine = create_engine_from_url(url, pool_size=2, pool_pre_ping=False)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            create_extensions(conn, ("pgstattuple",))
        with engine.begin() as conn:
            for name, value in (storage or {}).items():
                for t in ("archive_worker_runs", "archive_worker_runners"):
                    conn.execute(text(f"ALTER TABLE {t} SET ({name} = {int(value)})"))
        runner_id = uuid.uuid4()
        registry.register(engine, registry.RunnerRegistration(
            runner_id=runner_id, name="bench", hostname="bench", pid=0, package_version="bench",
            schema_revision=None, capabilities=WORKERS, concurrency=1, heartbeat_seconds=HEARTBEAT_S,
            lease_seconds=LEASE_S, devices=DEVICES, sees=SEES))
        ledger.heartbeat(engine, runner_id, LEASE_S, warm=WARM)  # the fork server's warm models, once
        _jobs(engine, runner_id, args.warmup, args.beats, args.scrape_every, steps, config_in_row)
        _vacuum(engine)
        before, heap_before = _sizes(engine), _heap(engine)
        with engine.connect() as pin:
            pin.execution_options(isolation_level="REPEATABLE READ")
            pin.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one()  # the snapshot is taken
            timings = _jobs(engine, runner_id, args.jobs, args.beats, args.scrape_every, steps, config_in_row)
            _vacuum(engine)
            after, heap_after = _sizes(engine), _heap(engine)
            pin.rollback()
    finally:
        engine.dispose()
    grown = {t: after[t] - before[t] for t in TABLES}
    return {"ledger": label, "jobs": args.jobs, "beats_per_job": args.beats if "beats" in steps else 0,
            "steps": ["enqueue", "claim", *steps, "finish"],
            "bytes_per_job": round(sum(grown.values()) / args.jobs),
            "per_table_bytes_per_job": {t: round(v / args.jobs) for t, v in grown.items() if before[t] or after[t]},
            "heap_bytes_per_job": _heap_growth(heap_before, heap_after, args.jobs),
            "under_the_pin": _slowdown(timings),
            "sizes_after": after}


def _heap_growth(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], jobs: int) -> dict[str, int]:
    """Live and dead heap bytes added per job, over the ledger's tables: what the ledger keeps (a finished
    run's row, its sample) against the versions only the pinned snapshot keeps."""
    return {kind: round(sum(after[t][kind] - before[t][kind] for t in after) / jobs) for kind in ("live", "dead")}


def peer_side(url: str, python: str, args: Any) -> dict[str, Any]:
    return run_peer(url, python, "peer_xmin.py", ["--jobs", str(args.jobs), "--warmup", str(args.warmup),
                                                  "--heartbeat", str(args.peer_heartbeat), "--beats", str(args.beats)])


def _head_apart(admin, u, suffix: str, label: str, args: Any, **side: Any) -> dict[str, Any]:
    """One more head ledger in a database of its own (``side``: ``ledger_side``'s options)."""
    name = f"{u.database}_{suffix}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = u.set(database=name).render_as_string(hide_password=False)
        migrate.upgrade(url)
        return ledger_side(url, label, args, **side)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--beats", type=int, default=2, help="heartbeats while each job runs")
    parser.add_argument("--scrape-every", type=int, default=50, help="jobs between two scrapes' folds (head)")
    parser.add_argument("--peer-python", default=None, help="a Python with procrastinate installed")
    parser.add_argument("--peer-heartbeat", type=float, default=0.1,
                        help="the peer worker's heartbeat; each of its jobs lasts --beats of them (0: its default "
                             "heartbeat and jobs that return at once)")
    parser.add_argument("--fillfactor", type=int, default=None,
                        help="also head with this fill factor on the runs and the registry (its own database)")
    parser.add_argument("--toast-target", type=int, default=None,
                        help="also head with this toast_tuple_target on the runs and the registry (its own "
                             "database; PostgreSQL toasts a row only past ~2 KB, whatever the target)")
    parser.add_argument("--steps-sweep", action="store_true",
                        help="also head with jobs of enqueue, claim and finish only, then adding record_start, "
                             "the progress, the beats one at a time (each in its own database): what each write "
                             "of a job costs, and the least a run's row costs whatever the heartbeat's design")
    args = parser.parse_args()
    with bench_database("bench_xmin") as url:
        u = make_url(url)
        admin = create_engine(u.set(drivername="postgresql+psycopg", database="postgres"),
                              isolation_level="AUTOCOMMIT")
        try:
            results = [_head_apart(admin, u, "in_row", "0021's record_start (the configuration in the run's row)",
                                   args, config_in_row=True),
                       ledger_side(url, "head", args)]
            for name, value in (("fillfactor", args.fillfactor), ("toast_tuple_target", args.toast_target)):
                if value:
                    results.append(_head_apart(admin, u, name, f"head, {name} {value}", args,
                                               storage={name: value}))
            if args.steps_sweep:
                for k in range(len(STEPS)):
                    steps = STEPS[:k]
                    results.append(_head_apart(admin, u, f"steps{k}", "head, " + " + ".join(
                        ["enqueue", "claim", *steps, "finish"]), args, steps=steps))
            if args.peer_python:
                results.append(peer_side(url, args.peer_python, args))
        finally:
            admin.dispose()
    for r in results:
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
