"""What the runner costs the shared database when it does little (issue 14), on real daemons.

1. Idle: N daemons (default 10) at the default --heartbeat 15 --lease 60 --poll 2, no work queued, over a
   window (default 120 s): statements/s (pg_stat_statements) and WAL bytes/s (pg_current_wal_lsn(),
   cluster-wide: autovacuum and checkpoints included). Targets: <= ~9 statements/s, <= 1 KB/s of WAL.
2. A child's database session, before/after: a fresh engine per run, as a child makes, reading what the
   resolver reads (the worker's settings row). Before: the dialect's first-connect queries (hstore
   lookup included) and the read inside BEGIN/ROLLBACK, as the child did before issue 14; after: the
   ``ServerFacts`` its supervisor now passes and the read in autocommit. Statements per session and the
   server's CPU (the postmaster and every backend, exited ones through the postmaster's cutime/cstime),
   same database, one after the other.
3. Per run, end to end: a trivial worker (bench-noop) run N times by one daemon (--poll 0.2): statements
   (by text) and server CPU per run; the supervisor reads the worker's settings, so the child opens no
   session (the bench's own enqueue and polling reads are subtracted from the statements, not from CPU).
Run:  .venv/bin/python bench/bench_idle.py [--runners 10] [--idle-seconds 120] [--sessions 50] [--runs 30]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import ServerCost, bench_database
from bench.bench_runner import Daemon
from scrinalia.db.engine import ServerFacts, create_engine_from_url
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.worker_settings import get_settings

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def server_cpu_seconds(postmaster: int) -> float:
    """The server's CPU so far: the postmaster's own and its waited-for (exited) children's, plus every
    live child's (backends, autovacuum, checkpointer, walwriter...)."""
    fields = _stat(postmaster)  # fields[11..14]: utime stime cutime cstime (after pid and comm)
    total = sum(int(v) for v in fields[11:15])
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                f = _stat(int(entry))
            except OSError:
                continue
            if int(f[1]) == postmaster:
                total += int(f[11]) + int(f[12])
    return total / TICK


def postmaster_pid(engine) -> int:
    with engine.connect() as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return int(_stat(backend)[1])


def _autovacuum_counts(engine) -> dict[str, tuple[int, int]]:
    """(autovacuum runs, autoanalyze runs) per table of this database."""
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(text(
            "SELECT relname, autovacuum_count, autoanalyze_count FROM pg_stat_all_tables"))}


def idle(url: str, engine, tmp: Path, runners: int, seconds: float) -> dict:
    # A server in service, not a database just created: its catalogs' first autoanalyze (after the
    # migrations' DDL) is done now, not in the window.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    daemons = [Daemon(url, tmp, f"idle-{i}", "--preload", "none", "--capabilities", "bench-noop",
                      timing=(), wait=False) for i in range(runners)]
    try:
        for d in daemons:
            d.wait_ready()
        time.sleep(5)  # every daemon past its start (register, first expiry, first heartbeat)
        cost = ServerCost(engine)
        before = _autovacuum_counts(engine)
        cost.start()
        time.sleep(seconds)
        spent = cost.stop()
        after = _autovacuum_counts(engine)
    finally:
        for d in daemons:
            d.stop()
    out = {"runners": runners, "seconds": seconds, "wal_bytes_per_s": round(spent["wal_bytes"] / seconds, 1),
           "autovacuum_in_window": {t: [a - b for a, b in zip(after[t], before.get(t, (0, 0)), strict=True)]
                                    for t in after if after[t] != before.get(t, (0, 0))}}
    if "statements" in spent:
        out["statements_per_s"] = round(spent["statements"] / seconds, 2)
        out["by_statement_per_s"] = [(q, round(n / seconds, 3)) for q, n in spent["by_statement"]]
    if "fpi_bytes" in spent:
        out["fpi_bytes_per_s"] = round(spent["fpi_bytes"] / seconds, 1)
        out["wal_by_relation_per_s"] = [(m, r, round(b / seconds, 1)) for m, r, b in spent["wal_by_relation"]]
    return out


def child_sessions(url: str, engine, sessions: int) -> dict:
    """One fresh engine per 'run', as a child makes, reading the worker's settings (the resolver's read)."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    facts = ServerFacts.of(engine)
    postmaster = postmaster_pid(engine)
    out = {}
    for label, before in (("before", True), ("after", False)):
        cost = ServerCost(engine)
        cost.start()
        cpu0 = server_cpu_seconds(postmaster)
        t0 = time.perf_counter()
        for _ in range(sessions):
            if before:  # the dialect's first-connect queries and hstore lookup, the read in BEGIN/ROLLBACK
                child = create_engine_from_url(url, application_name="bench-child", use_native_hstore=True)
                with child.connect() as conn:
                    get_settings(conn, "bench-noop")
            else:  # told the server's facts, the read in autocommit (one_statement)
                child = create_engine_from_url(url, application_name="bench-child", server_facts=facts)
                get_settings(child, "bench-noop")
            child.dispose()
        wall = time.perf_counter() - t0
        time.sleep(0.5)  # the last backends exit and are reaped (their CPU moves to the postmaster's cutime)
        cpu = server_cpu_seconds(postmaster) - cpu0
        spent = cost.stop()
        out[label] = {"sessions": sessions, "statements_per_session": round(spent.get("statements", 0) / sessions, 2),
                      "server_cpu_ms_per_session": round(cpu * 1000 / sessions, 2),
                      "client_wall_ms_per_session": round(wall * 1000 / sessions, 2),
                      "statements": spent.get("by_statement", [])[:8]}
    return out


def per_run(url: str, engine, tmp: Path, runs: int) -> dict:
    daemon = Daemon(url, tmp, "per-run", "--preload", "none", "--capabilities", "bench-noop",
                    timing=("--poll", "0.2"))
    postmaster = postmaster_pid(engine)
    try:
        time.sleep(1)
        cost = ServerCost(engine)
        cost.start()
        cpu0 = server_cpu_seconds(postmaster)
        t0 = time.perf_counter()
        polls = 0
        for _ in range(runs):
            run = ledger.enqueue(engine, "bench-noop", {})
            deadline = time.monotonic() + 60
            while getattr(ledger.get_run(engine, run.run_id), "status", None) != "SUCCESS":
                polls += 1
                if time.monotonic() > deadline:
                    raise RuntimeError(f"run {run.run_id} did not finish")
                time.sleep(0.1)
            polls += 1
        wall = time.perf_counter() - t0
        time.sleep(0.5)
        cpu = server_cpu_seconds(postmaster) - cpu0
        spent = cost.stop()
    finally:
        daemon.stop()
    # The bench's own statements (its enqueue and its polling reads) are not the runner's.
    runner_statements = spent.get("statements", 0) - runs - polls
    return {"runs": runs, "wall_s": round(wall, 2),
            "runner_statements_per_run": round(runner_statements / runs, 2),
            "server_cpu_ms_per_run_incl_bench_polling": round(cpu * 1000 / runs, 2),
            "bench_polls": polls, "statements": spent.get("by_statement", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runners", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=120)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--skip", default="", help="comma list of idle,sessions,runs")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    os.environ.setdefault("SCRINALIA_WORKER_PLUGINS", "bench.runner_workers:ALL")
    with bench_database("bench_idle") as url, tempfile.TemporaryDirectory() as tmp:
        engine = create_engine_from_url(url, pool_size=2, pool_pre_ping=False)
        # Idle first, on a quiet database (the other sections' writes would wake autovacuum in its window).
        if "idle" not in skip:
            print(json.dumps({"idle": idle(url, engine, Path(tmp), args.runners, args.idle_seconds)}), flush=True)
        if "sessions" not in skip:
            print(json.dumps({"child_session": child_sessions(url, engine, args.sessions)}), flush=True)
        if "runs" not in skip:
            print(json.dumps({"per_run": per_run(url, engine, Path(tmp), args.runs)}), flush=True)
        engine.dispose()


if __name__ == "__main__":
    main()
