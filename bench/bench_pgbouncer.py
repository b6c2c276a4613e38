"""PgBouncer in transaction mode against a direct connection, in one run; reconnect after a promotion.

1. Pick-up latency (``started_at - queued_at``, the database's clock) and statements per run
   (pg_stat_statements over the window, every client of the database: parent, children, idle polls) for
   one runner daemon, ``--poll 1``, in three topologies on the same cluster:
   ``direct`` (its LISTEN hears), ``pgbouncer`` (transaction mode, documented settings: the LISTEN is
   found deaf, the poll picks up), ``pgbouncer+session-url`` (RUNNER_DATABASE_SESSION_URL direct: the
   LISTEN hears, everything else goes through the pooler).
2. A claiming soak through PgBouncer (``--soak-seconds``, 300 by default): a daemon with --concurrency 2
   claims runs of 8 workers enqueued as fast as they end; every run must end SUCCESS and no log (the
   runner's, PgBouncer's) may name a prepared statement.
3. Reconnect time after a promotion: a primary and a synchronous standby, a daemon with a run in flight,
   the primary stopped with ``pg_ctl stop -m immediate`` and the standby promoted: seconds from the
   promotion to the first heartbeat renewed on the new primary, with libpq's multi-host URL and with
   SQLAlchemy's ``?host=h1:p1&host=h2:p2`` form.

Run:  .venv/bin/python bench/bench_pgbouncer.py [--runs 15] [--soak-seconds 300] [--failovers 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy.engine import make_url

from bench._pg import ServerCost, bench_database, percentile
from runner import control
from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from tests.foundation.clusters import psql
from tests.topology.pgbouncer import DOCUMENTED_SETTINGS, pgbouncer
from tests.topology.standby import primary_and_standby

PREPARED = re.compile(r"prepared statement|_pg3_\d|DuplicatePreparedStatement|InvalidSqlStatementName")
SOAK_WORKERS = [f"sleepy-{i:02d}" for i in range(8)]


class Daemon:
    """A ``scrinalia-runner daemon`` subprocess with the test workers, its log in a file."""

    def __init__(self, env: dict[str, str], flags: list[str], work: Path) -> None:
        self.name = f"bench-{uuid.uuid4().hex[:6]}"
        self.socket = work / f"{self.name}.sock"
        self.log_path = work / f"{self.name}.log"
        argv = [sys.executable, "-m", "runner.cli", "daemon", "--name", self.name, "--socket", str(self.socket),
                "--preload", "none", *flags]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        wait(lambda: self._answers(), 60, "the daemon to answer")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited:\n{self.log()}")
        try:
            self.status()
            return True
        except (OSError, ValueError):
            return False

    def status(self) -> dict[str, Any]:
        return control.query(self.socket, {"command": "status"}, timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(interval)


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "RUNNER_", "DB_", "PG"))}
    env.update(DATABASE_URL=url, SCRINALIA_WORKER_PLUGINS="tests.runner.workers:ALL", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1", **extra)
    return env


def finished(engine: Any, run_id: uuid.UUID, timeout: float = 120) -> Any:
    return wait(lambda: (r := ledger.get_run(engine, run_id)) is not None
                and r.status in ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED") and r, timeout, f"run {run_id}")


def pickup(engine: Any, url: str, env: dict[str, str], work: Path, runs: int) -> dict[str, Any]:
    """One daemon (--poll 1), ``runs`` runs one after another: pick-up and statements per run."""
    daemon = Daemon(env, ["--poll", "1", "--heartbeat", "2", "--lease", "16", "--capabilities", "ok"], work)
    try:
        wait(lambda: daemon.status()["notifications"]["state"] in ("hears", "deaf"), 30, "the LISTEN's verdict")
        listen = daemon.status()["notifications"]["state"]
        cost = ServerCost(engine)
        cost.start()
        started = time.monotonic()
        latencies, statuses = [], []
        for _ in range(runs):
            time.sleep(0.3)  # not in step with the poll
            row = finished(engine, ledger.enqueue(engine, "ok", {}, requested_by="bench").run_id)
            statuses.append(row.status)
            latencies.append((row.started_at - row.queued_at).total_seconds() * 1000)
        window = time.monotonic() - started
        spent = cost.stop()
        return {"listen": listen, "runs": runs, "success": statuses.count("SUCCESS"),
                "pickup_ms_p50": round(percentile(latencies, 0.5), 1),
                "pickup_ms_p95": round(percentile(latencies, 0.95), 1), "pickup_ms_max": round(max(latencies), 1),
                "statements_per_run": round(spent.get("statements", 0) / runs, 1),
                # of which the session bounds sent with every transaction (decision 0121; same round trip)
                "bounds_statements_per_run": round(sum(calls for query, calls in spent.get("by_statement", [])
                                                       if query.startswith("SELECT set_config")) / runs, 1),
                "window_seconds": round(window, 1), "prepared_errors": len(PREPARED.findall(daemon.log()))}
    finally:
        daemon.stop()


def soak(engine: Any, env: dict[str, str], work: Path, seconds: float,
         bouncer_log: Callable[[], str]) -> dict[str, Any]:
    """Claiming through the pooler for ``seconds``: every worker re-enqueued as soon as its run ends."""
    daemon = Daemon(env, ["--poll", "0.2", "--heartbeat", "1", "--lease", "8", "--concurrency", "2",
                          "--capabilities", ",".join(SOAK_WORKERS)], work)
    outcomes: dict[str, int] = {}
    try:
        active = {w: ledger.enqueue(engine, w, {"options": {"units": 3, "pause": 0.02}}, requested_by="bench").run_id
                  for w in SOAK_WORKERS}
        deadline = time.monotonic() + seconds
        while active:
            for worker, run_id in list(active.items()):
                row = ledger.get_run(engine, run_id)
                if row is None or row.status not in ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"):
                    continue
                outcomes[row.status] = outcomes.get(row.status, 0) + 1
                if time.monotonic() < deadline:
                    active[worker] = ledger.enqueue(engine, worker, {"options": {"units": 3, "pause": 0.02}},
                                                    requested_by="bench").run_id
                else:
                    del active[worker]
            time.sleep(0.05)
        status = daemon.status()
        return {"seconds": seconds, "runs": sum(outcomes.values()), "outcomes": outcomes,
                "claims_sent": status["database"]["statements"].get("claim", 0),
                "prepared_errors_runner_log": len(PREPARED.findall(daemon.log())),
                "prepared_errors_pgbouncer_log": len(PREPARED.findall(bouncer_log())),
                "listen": status["notifications"]["state"]}
    finally:
        daemon.stop()


def reconnect_after_promotion(form: str, work: Path) -> float:
    """Seconds from the standby's promotion to the first heartbeat renewed on it."""
    with primary_and_standby() as pair:
        psql(pair.primary, "postgres", 'CREATE DATABASE "failover"')
        if form == "libpq":
            url = pair.url("failover")
        else:
            url = (f"postgresql://postgres@/failover?host=127.0.0.1:{pair.primary.port}"
                   f"&host=127.0.0.1:{pair.standby.port}&target_session_attrs=read-write")
        migrate.upgrade(url)
        engine = create_engine_from_url(url)
        daemon = Daemon(env_for(url), ["--poll", "0.2", "--heartbeat", "1", "--lease", "12", "--capabilities", "slow"],
                        work)
        try:
            run = ledger.enqueue(engine, "slow", {"options": {"units": 100, "pause": 0.05}}, requested_by="bench")
            wait(lambda: any(c["phase"] == "running" for c in daemon.status()["children"]), 30, "a running child")
            promoted = pair.fail_over()

            def renewed() -> bool:
                db = daemon.status()["database"]
                age = db["last_heartbeat_age_seconds"]
                return db["state"] == "ok" and age is not None and age < time.monotonic() - promoted

            wait(renewed, 60, "a heartbeat on the new primary", interval=0.02)
            back = time.monotonic() - promoted
            row = finished(engine, run.run_id)
            if row.status != "SUCCESS":
                raise RuntimeError(f"the run in flight ended {row.status}: {row.error}")
            return back
        finally:
            daemon.stop()
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--soak-seconds", type=float, default=300.0)
    parser.add_argument("--failovers", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "load": os.getloadavg()}
    with bench_database("bench_pgbouncer") as url, tempfile.TemporaryDirectory() as tmpdir:
        work = Path(tmpdir)
        engine = create_engine_from_url(url)
        server_port = make_url(url).port or 5432
        with pgbouncer(server_port, settings=DOCUMENTED_SETTINGS) as bouncer:
            pooled = make_url(url).set(host="127.0.0.1", port=bouncer.port).render_as_string(hide_password=False)
            results["pickup"] = {
                "direct": pickup(engine, url, env_for(url), work, args.runs),
                "pgbouncer": pickup(engine, pooled, env_for(pooled), work, args.runs),
                "pgbouncer+session-url": pickup(engine, pooled, env_for(pooled, RUNNER_DATABASE_SESSION_URL=url),
                                                work, args.runs),
            }
            print(json.dumps(results, indent=2), flush=True)
            if args.soak_seconds > 0:
                results["soak_pgbouncer"] = soak(engine, env_for(pooled), work, args.soak_seconds, bouncer.log)
                print(json.dumps(results["soak_pgbouncer"], indent=2), flush=True)
        engine.dispose()
    if args.failovers > 0:
        for form in ("libpq", "sqlalchemy"):
            seconds = [reconnect_after_promotion(form, Path(tempfile.mkdtemp())) for _ in range(args.failovers)]
            results[f"reconnect_after_promotion_{form}_s"] = {
                "samples": [round(s, 2) for s in seconds], "p50": round(percentile(seconds, 0.5), 2),
                "max": round(max(seconds), 2)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
