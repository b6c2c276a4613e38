"""The soak: many runs across three daemons under random faults, every outcome checked (issue 9).

Not part of ``make test``. Three ``scrinalia-runner daemon`` processes (short timings: heartbeat 1 s,
lease 4 s, poll 0.2 s) share eight ``stamper-*`` workers (``tests/runner/workers.py``: each batch stamps
its worker's pending ``fence_units`` rows through the fenced ``RunContext.commit``). A feeder keeps every
worker's slot busy until ``--runs`` runs were enqueued; meanwhile a fault injector picks, every
``--fault-every`` seconds on average, one of:

    child-kill     SIGKILL one running child                        -> FAILED (signal)
    parent-kill    SIGKILL a daemon's process group, restart it     -> its runs INTERRUPTED (lease-lost)
    parent-stop    SIGSTOP a daemon 1-6 s, then SIGCONT              -> lease-lost when past the lease
    child-stop     SIGSTOP one child 1-6 s, then SIGCONT             -> SUCCESS (its session is cut, retried)
    db-restart     ``pg_ctl restart -m fast``                        -> nothing fails
    stall          (per run, at enqueue) a batch that sleeps inside its transaction: 1 s (commits) or
                   6 s (longer than the idle-in-transaction bound: retried until the lease, then FAILED)
    partition      every packet to or from the cluster's port dropped for ``--partition-seconds`` (an
                   nftables table of its own, as in tests/runner/netfault.py: root and nft needed, else
                   skipped), or ``--partition-start CMD`` / ``--partition-stop CMD`` around it

At the end (every run terminal, the daemons drained) it asserts, from the database alone:

* 0 stuck: no QUEUED or RUNNING row;
* 0 finished twice: a trigger records every status change of a run; none enters a terminal status twice;
* 0 archive writes committed after their run's lease: the cluster runs with ``track_commit_timestamp``;
  each stamped unit's commit time (``pg_xact_commit_timestamp(xmin)``) is compared with the run's lease as
  the last committed change of its row before that moment left it (the same trigger records each change,
  in the changing transaction, so its commit time is exact); a unit is never stamped twice;
* every outcome explained: SUCCESS, or a status and reason that a fault recorded against that run, its
  runner or the database at that time accounts for.

Run:  .venv/bin/python bench/bench_soak.py --runs 1000 [--fault-every 1.5] [--seed 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text

from runner import control
from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.local_cluster import LocalCluster
from scrinalia.domains.archive import ledger
from tests.runner.netfault import drop_port, nft_available
from tests.runner.workers import STAMPER_TABLE_SQL

PLUGINS = "tests.runner.workers:ALL"
WORKERS = [f"stamper-{c}" for c in "abcdefgh"]
TIMINGS = ("--heartbeat", "1", "--lease", "4", "--poll", "0.2")
LEASE = 4.0
UNITS_PER_RUN = 6

# Every change of a run's status or lease, recorded in the changing transaction (its xmin's commit time
# is the moment the change became visible).
HISTORY_SQL = """
CREATE TABLE soak_run_history (
    run_id uuid NOT NULL, status text NOT NULL, runner_id uuid, lease_expires_at timestamptz,
    exit_reason text
);
CREATE INDEX ON soak_run_history (run_id);
CREATE FUNCTION soak_record_run() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
       OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at
       OR OLD.runner_id IS DISTINCT FROM NEW.runner_id THEN
        INSERT INTO public.soak_run_history VALUES
            (NEW.run_id, NEW.status::text, NEW.runner_id, NEW.lease_expires_at, NEW.exit_reason);
    END IF;
    RETURN NULL;
END $fn$;
CREATE TRIGGER trg_soak_record_run AFTER INSERT OR UPDATE ON archive_worker_runs
    FOR EACH ROW EXECUTE FUNCTION soak_record_run();
"""


@dataclass
class Fault:
    kind: str
    at: float          # wall clock (time.time()) at the start
    until: float       # wall clock at the end (the same for an instant fault)
    daemon: str | None = None
    run_id: str | None = None


@dataclass
class Daemon:
    name: str
    socket: Path
    log: Path
    proc: subprocess.Popen | None = None
    stopped: bool = False
    restarts: int = 0

    def start(self, env: dict[str, str]) -> None:
        argv = [sys.executable, "-m", "runner.cli", "daemon", "--name", self.name, "--socket", str(self.socket),
                "--preload", "none", "--concurrency", "3", "--capabilities", ",".join(WORKERS), *TIMINGS]
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def children(self) -> list[dict[str, Any]]:
        try:
            return control.query(self.socket, {"command": "status"}, timeout=1.0)["children"]
        except (OSError, ValueError, KeyError):
            return []

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


@dataclass
class Soak:
    args: argparse.Namespace
    url: str
    cluster: LocalCluster | None
    env: dict[str, str]
    daemons: list[Daemon]
    rng: random.Random
    faults: list[Fault] = field(default_factory=list)
    enqueued: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id -> its options

    def __post_init__(self) -> None:
        self.engine = create_engine_from_url(self.url, pool_size=4)

    # --- feeding ---------------------------------------------------------------------------------

    def feed(self) -> None:
        """One run for every worker whose slot is free, until --runs were enqueued."""
        with self.engine.connect() as conn:
            busy = {r[0] for r in conn.execute(text(
                "SELECT worker_name FROM archive_worker_runs WHERE status IN ('QUEUED', 'RUNNING')"))}
        for worker in WORKERS:
            if worker in busy or len(self.enqueued) >= self.args.runs:
                continue
            options: dict[str, Any] = {"pause": round(self.rng.uniform(0.0, 0.1), 3)}
            if self.rng.random() < self.args.stall_rate:
                options.update(hold_at=self.rng.randint(1, 3), hold=self.rng.choice([1.0, 6.0]))
            with self.engine.begin() as conn:
                conn.execute(text("INSERT INTO fence_units (worker) SELECT :w FROM generate_series(1, :n)"),
                             {"w": worker, "n": UNITS_PER_RUN})
            try:
                run = ledger.enqueue(self.engine, worker, {"options": options}, requested_by="soak")
            except Exception:
                continue
            self.enqueued[str(run.run_id)] = options

    # --- faults ------------------------------------------------------------------------------------

    def live(self) -> list[Daemon]:
        return [d for d in self.daemons if d.proc is not None and d.proc.poll() is None and not d.stopped]

    def inject(self) -> None:
        kinds = [k for k in self.args.faults if k != "partition" or self.args.partition_start or nft_available()]
        kind = self.rng.choice(kinds)
        now = time.time()
        if kind in ("child-kill", "child-stop"):
            candidates = [(d, c) for d in self.live() for c in d.children() if c.get("phase") == "running"]
            if not candidates:
                return
            daemon, child = self.rng.choice(candidates)
            if kind == "child-kill":
                _kill(child["pid"], signal.SIGKILL)
                self.faults.append(Fault(kind, now, now, daemon.name, child["run_id"]))
            else:
                pause = self.rng.uniform(1, 6)
                _kill(child["pid"], signal.SIGSTOP)
                time.sleep(pause)
                _kill(child["pid"], signal.SIGCONT)
                self.faults.append(Fault(kind, now, time.time(), daemon.name, child["run_id"]))
        elif kind == "parent-kill":
            daemons = self.live()
            if len(daemons) < 2:
                return
            daemon = self.rng.choice(daemons)
            daemon.signal_group(signal.SIGKILL)
            assert daemon.proc is not None
            daemon.proc.wait()
            time.sleep(self.rng.uniform(0.5, 2))
            daemon.start(self.env)
            daemon.restarts += 1
            self.faults.append(Fault(kind, now, time.time(), daemon.name))
        elif kind == "parent-stop":
            daemons = self.live()
            if len(daemons) < 2:
                return
            daemon = self.rng.choice(daemons)
            pause = self.rng.uniform(1, 6)
            daemon.stopped = True
            daemon.signal_group(signal.SIGSTOP)
            time.sleep(pause)
            daemon.signal_group(signal.SIGCONT)
            daemon.stopped = False
            self.faults.append(Fault(kind, now, time.time(), daemon.name))
        elif kind == "db-restart" and self.cluster is not None:
            restart_cluster(self.cluster)
            self.faults.append(Fault(kind, now, time.time()))
        elif kind == "partition" and self.args.partition_start:
            subprocess.run(self.args.partition_start, shell=True, check=False)
            time.sleep(self.args.partition_seconds)
            subprocess.run(self.args.partition_stop, shell=True, check=False)
            self.faults.append(Fault(kind, now, time.time()))
        elif kind == "partition" and self.cluster is not None:
            with drop_port(self.cluster.port):  # silent: no RST, no ICMP (a VPN that goes away)
                time.sleep(self.args.partition_seconds)
            self.faults.append(Fault(kind, now, time.time()))

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> float:
        started = time.monotonic()
        next_fault = time.monotonic() + self.rng.expovariate(1 / self.args.fault_every)
        while True:
            try:
                self.feed()
                if len(self.enqueued) >= self.args.runs and self.active() == 0:
                    break
            except Exception as exc:
                print(f"feeder: {type(exc).__name__}", file=sys.stderr)
            if time.monotonic() >= next_fault and len(self.enqueued) < self.args.runs:
                self.inject()
                next_fault = time.monotonic() + self.rng.expovariate(1 / self.args.fault_every)
            for daemon in self.daemons:  # a daemon that exited on its own is a finding, and restarted
                if daemon.proc is not None and daemon.proc.poll() is not None and not daemon.stopped:
                    print(f"daemon {daemon.name} exited {daemon.proc.returncode}; restarting", file=sys.stderr)
                    self.faults.append(Fault("daemon-exit", time.time(), time.time(), daemon.name))
                    daemon.start(self.env)
            if time.monotonic() - started > self.args.timeout:
                raise SystemExit(f"soak: timed out after {self.args.timeout}s with {self.active()} active runs")
            time.sleep(0.1)
        return time.monotonic() - started

    def active(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM archive_worker_runs "
                                     "WHERE status IN ('QUEUED', 'RUNNING')")).scalar_one()

    # --- the verdict -------------------------------------------------------------------------------

    def verdict(self, seconds: float) -> dict[str, Any]:
        with self.engine.connect() as conn:
            runs = conn.execute(text(
                "SELECT r.run_id::text AS run_id, r.worker_name, r.status::text AS status, r.exit_reason, r.error, "
                "r.started_at, r.finished_at, n.name AS daemon FROM archive_worker_runs r "
                "LEFT JOIN archive_worker_runners n ON n.runner_id = r.runner_id")).all()
            stuck = [r.run_id for r in runs if r.status in ("QUEUED", "RUNNING")]
            twice = conn.execute(text(
                "SELECT run_id FROM soak_run_history WHERE status IN ('SUCCESS', 'FAILED', 'CANCELLED', 'INTERRUPTED') "
                "GROUP BY run_id HAVING count(*) > 1")).scalars().all()
            restamped = conn.execute(text("SELECT count(*) FROM fence_units WHERE done_count > 1")).scalar_one()
            # A unit's commit against the run's state as last committed before it.
            late = conn.execute(text(
                """
                WITH writes AS (
                    SELECT u.id, u.done_by, pg_xact_commit_timestamp(u.xmin) AS committed_at
                      FROM fence_units u WHERE u.done_by IS NOT NULL
                ), state AS (
                    SELECT w.id, w.committed_at, w.done_by,
                           (SELECT h.status FROM soak_run_history h
                             WHERE h.run_id = w.done_by AND pg_xact_commit_timestamp(h.xmin) < w.committed_at
                             ORDER BY pg_xact_commit_timestamp(h.xmin) DESC LIMIT 1) AS status,
                           (SELECT h.lease_expires_at FROM soak_run_history h
                             WHERE h.run_id = w.done_by AND pg_xact_commit_timestamp(h.xmin) < w.committed_at
                             ORDER BY pg_xact_commit_timestamp(h.xmin) DESC LIMIT 1) AS lease
                      FROM writes w
                )
                SELECT id, done_by, committed_at, status, lease FROM state
                 WHERE status IS DISTINCT FROM 'RUNNING' OR lease IS NULL OR committed_at >= lease
                """)).all()
            writes = conn.execute(text("SELECT count(*) FROM fence_units WHERE done_by IS NOT NULL")).scalar_one()
            margin = conn.execute(text(
                """
                SELECT min(extract(epoch FROM l.lease - l.committed_at)) FROM (
                    SELECT pg_xact_commit_timestamp(u.xmin) AS committed_at,
                           (SELECT h.lease_expires_at FROM soak_run_history h
                             WHERE h.run_id = u.done_by
                               AND pg_xact_commit_timestamp(h.xmin) < pg_xact_commit_timestamp(u.xmin)
                             ORDER BY pg_xact_commit_timestamp(h.xmin) DESC LIMIT 1) AS lease
                      FROM fence_units u WHERE u.done_by IS NOT NULL) AS l
                """)).scalar_one()
        outcomes: dict[str, int] = {}
        unexplained = []
        for r in runs:
            key = f"{r.status}/{r.exit_reason or '-'}"
            why = self.explain(r)
            outcomes[f"{key} ({why})" if why else key] = outcomes.get(f"{key} ({why})" if why else key, 0) + 1
            if why is None:
                unexplained.append({"run_id": r.run_id, "status": r.status, "exit_reason": r.exit_reason,
                                    "error": (r.error or "").splitlines()[0][:200] if r.error else None})
        fault_counts: dict[str, int] = {}
        for f in self.faults:
            fault_counts[f.kind] = fault_counts.get(f.kind, 0) + 1
        stalls = sum(1 for o in self.enqueued.values() if "hold_at" in o)
        return {
            "runs": len(runs), "seconds": round(seconds, 1), "runs_per_second": round(len(runs) / seconds, 2),
            "faults": {**fault_counts, "stalled batches (enqueued)": stalls},
            "outcomes": dict(sorted(outcomes.items())),
            "stuck": stuck, "finished_twice": list(map(str, twice)), "units_stamped_twice": restamped,
            "archive_writes": writes, "writes_after_lease": [dict(w._mapping) for w in late],
            "smallest_lease_margin_seconds": float(margin) if margin is not None else None,
            "unexplained": unexplained,
            "daemon_restarts": {d.name: d.restarts for d in self.daemons},
        }

    def explain(self, r: Any) -> str | None:
        """The fault that accounts for a run's outcome, or None (unexplained)."""
        if r.status == "SUCCESS":
            return ""
        start = _ts(r.started_at)
        end = _ts(r.finished_at)
        options = self.enqueued.get(r.run_id, {})
        touching = [f for f in self.faults if start is not None and end is not None
                    and f.at <= end + 1 and f.until >= start - 1]
        mine = [f for f in touching if f.run_id == r.run_id]
        of_daemon = [f for f in touching if f.daemon is not None and f.daemon == r.daemon]
        global_faults = [f for f in touching if f.daemon is None]
        error = r.error or ""
        if r.status == "FAILED" and r.exit_reason == "signal" and any(f.kind == "child-kill" for f in mine):
            return "child killed"
        # The SDK names this cause BatchHeldOpen (a DatabaseOutage) once a batch held open past lease/2
        # fails again after its retry; a run of this soak holds its batch only when it was enqueued so.
        held_open = "DatabaseOutage" in error or error.startswith("BatchHeldOpen:")
        if r.status == "FAILED" and held_open and options.get("hold", 0) > LEASE / 2:
            return "stalled batch longer than the session bound"
        if r.status == "INTERRUPTED" and r.exit_reason == "lease-lost":
            if any(f.kind in ("parent-kill", "parent-stop", "daemon-exit") for f in of_daemon):
                return "its runner was killed or stopped"
            if any(f.kind == "child-stop" for f in mine):
                return "its child was stopped"
            if global_faults:
                return "database restart or partition"
        if r.status == "FAILED" and "DatabaseOutage" in error and global_faults:
            return "database outage longer than the lease"
        return None


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _kill(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # a child is its own process group's leader: it and whatever it started
    except ProcessLookupError:
        pass


def restart_cluster(cluster: LocalCluster) -> None:
    log = cluster.data_dir.parent / "postgres.log"
    subprocess.run(cluster._as_server_user([str(cluster.bindir / "pg_ctl"), "-D", str(cluster.data_dir),
                                            "-l", str(log), "-m", "fast", "-w", "restart"]),
                   capture_output=True, timeout=120, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--fault-every", type=float, default=1.5, help="mean seconds between two faults")
    parser.add_argument("--faults", default="child-kill,parent-kill,parent-stop,child-stop,db-restart,partition",
                        type=lambda s: [k.strip() for k in s.split(",") if k.strip()])
    parser.add_argument("--stall-rate", type=float, default=0.03, help="share of runs with a stalled batch")
    parser.add_argument("--partition-start", default=None, help="shell command that starts a partition")
    parser.add_argument("--partition-stop", default=None, help="shell command that ends it")
    parser.add_argument("--partition-seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=7200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="scrinalia-soak-"))
    cluster = LocalCluster.create(work / "cluster")
    cluster.start(fsync=False, max_connections=200, settings={"track_commit_timestamp": "on"})
    daemons: list[Daemon] = []
    try:
        url = cluster.url("postgres").rsplit("/", 1)[0] + "/postgres"
        admin = create_engine_from_url(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text('CREATE DATABASE "soak"'))
        admin.dispose()
        url = cluster.url("soak")
        migrate.upgrade(url)
        setup = create_engine_from_url(url)
        with setup.begin() as conn:
            conn.execute(text(STAMPER_TABLE_SQL))
            conn.execute(text(HISTORY_SQL))
        setup.dispose()
        env = dict(os.environ, DATABASE_URL=url, SCRINALIA_WORKER_PLUGINS=PLUGINS, PYTHONPATH=str(ROOT),
                   PYTHONUNBUFFERED="1")
        env.pop("RUNNER_DATABASE_URL", None)
        env.pop("NOTIFY_SOCKET", None)
        daemons = [Daemon(f"soak-{i}", work / f"soak-{i}.sock", work / f"soak-{i}.log") for i in range(3)]
        for d in daemons:
            d.start(env)
        time.sleep(2)
        soak = Soak(args, url, cluster, env, daemons, random.Random(args.seed))
        seconds = soak.run()
        for d in daemons:
            d.signal_group(signal.SIGCONT)
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGTERM)
        for d in daemons:
            if d.proc is not None:
                try:
                    d.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    d.signal_group(signal.SIGKILL)
        result = soak.verdict(seconds)
        soak.engine.dispose()
    finally:
        for d in daemons:
            d.signal_group(signal.SIGKILL)
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2, default=str))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    ok = not (result["stuck"] or result["finished_twice"] or result["units_stamped_twice"]
              or result["writes_after_lease"] or result["unexplained"])
    print("soak: OK" if ok else "soak: FAILED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
