"""One history: a seed's world, its runners (the production ``Supervisor``), its workload and faults.

``Simulation(seed).run()`` builds the world from the seed alone: 2-3 runners (each the production
``runner.supervisor.Supervisor`` over the simulated ports), an API that enqueues and cancels runs, the
faults of ``runner.simulation.faults`` on their dials. Runs are enqueued and faults injected for
``ACTIVE_SECONDS``; then the world settles (no new faults, no new runs) until every run can end, and the
end invariants are checked. A runner killed or drained is replaced by a new one (a restart).
"""
from __future__ import annotations

import functools
import logging
import os
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy.exc import DBAPIError

from runner.forkserver import ForkServerNotAnswering  # noqa: F401 - the launcher's error, named for readers
from runner.loop_state import ChildSetup, Services
from runner.memory_ledger import MemoryDatabase
from runner.options import RunnerOptions
from runner.ports import Host as Ports
from runner.simulation.control import Client, SimControl
from runner.simulation.database import Network, SessionFaults, Window, WriteCheck, elapse_for
from runner.simulation.faults import FAULT_KINDS, Dials, FaultPlan, Scheduled
from runner.simulation.invariants import Checker, Violation
from runner.simulation.processes import Host, SimChild, SimClock, SimProcesses, SimWaiter
from runner.simulation.world import World
from runner.supervisor import Supervisor
from scrinalia.domains.archive.errors import RunAlreadyFinished, RunNotFound, WorkerRunAlreadyActive
from scrinalia.domains.archive.registry import RunnerRegistration
from scrinalia.domains.archive.workers.sdk import ResolvedConfig

ACTIVE_SECONDS = 30.0
WORKERS = ("w0", "w1", "w2", "w3", "w4")
#: (heartbeat, lease): the default's shape, shorter (more of everything per virtual second)
CADENCES = ((1.0, 4.0), (0.5, 2.5), (2.0, 8.0), (1.0, 6.0))


@dataclass(frozen=True)
class SimSpec:
    """A worker of the simulated catalogue (the part of ``WorkerSpec`` the supervisor reads)."""

    name: str
    resolver: object | None
    engine_source: str = "simulated"

    def resolve(self, engine: Any, request: dict[str, Any], layer: Any = None) -> ResolvedConfig:
        options = dict((request or {}).get("options") or {})
        if options.get("invalid"):
            raise ValueError(f"InvalidOption: {self.name} refuses option invalid={options['invalid']!r}")
        return ResolvedConfig(engine_name="simulated", preset=None, db_batch_size=16, options=options,
                              engine_options={}, config={"worker": self.name}, sources={})


# Half the workers have a resolver of their own; every fourth takes its engine from the LLM_CHECK rule, so
# the claim reads that rule through the port too (decision 0351).
CATALOGUE = {name: SimSpec(name, resolver=None if i % 2 else "own",
                           engine_source="llm_check_rule" if i % 4 == 0 else "simulated")
             for i, name in enumerate(WORKERS)}


@dataclass
class SeedResult:
    seed: int
    steps: int
    virtual_seconds: float
    faults: Counter[str]
    violations: list[Violation]
    digest: int
    runs: Counter[str] = field(default_factory=Counter)


class Simulation:
    def __init__(self, seed: int, *, dials: Dials | None = None,
                 trace: Callable[[float, str, str], None] | None = None) -> None:
        self.seed = seed
        self.digest = 0
        self.world = World(seed, self._trace_sink(trace))
        self.rng = self.world.rng
        heartbeat, lease = CADENCES[self.rng.randrange(len(CADENCES))]
        self.cadence = (heartbeat, lease)
        self.poll = self.rng.choice((0.25, 0.5, 1.0))
        self.options_template: dict[str, Any] = dict(
            heartbeat_seconds=heartbeat, lease_seconds=lease, poll_seconds=self.poll, listen=False,
            drain_timeout=4.0, cancel_grace=2.0, kill_grace=1.0,
            stall_timeout=3.0, devices="none", start_method="forkserver", preload=())
        self.timings = RunnerOptions(name="template", **self.options_template).validate().timings
        self.db = MemoryDatabase(clock=self.world.db_now, elapse=elapse_for(self.world))
        self.api = self.db.session(lock_timeout_s=5.0, name="api")
        self.network = Network()
        self.faults = FaultPlan(self.rng, dials or Dials(), lease, 3.0)
        self.hosts: list[Host] = []
        self.children: dict[int, SimChild] = {}
        self.live: dict[int, SimChild] = {}  # the children alive now, with their run
        self.excuses: dict[str, list[tuple[float, float]]] = {}
        self.checker = Checker(self)
        self.world.after_step = self.checker.check_step
        self.stop_now = False
        self._quiet = trace is None
        self._pid = 1000
        self._runner_number = 0
        self.settle_seconds = 3 * lease + 3.0 + 3.0 + 2.0 + 10.0  # leases, stall + probe, kill grace, the runs

    def _trace_sink(self, trace: Callable[[float, str, str], None] | None) -> Callable[[float, str, str], None]:
        def sink(at: float, who: str, what: str) -> None:
            self.digest = zlib.crc32(f"{at:.6f} {who} {what}".encode(), self.digest)
            if trace is not None:
                trace(at, who, what)

        return sink

    # --- what the processes tell the world ----------------------------------------------------------

    def new_pid(self) -> int:
        self._pid += 1
        return self._pid

    def child_started(self, child: SimChild) -> None:
        self.children[child.pid] = child
        self.live[child.pid] = child
        self.world.trace(child.host.name, f"child {child.pid} runs {child.run_id} ({child.plan})")

    def child_died(self, child: SimChild) -> None:
        self.live.pop(child.pid, None)
        self.world.trace(child.host.name, f"child {child.pid} ended: {child.exit.describe() if child.exit else '?'}")

    def batch_committed(self, child: SimChild, index: int) -> None:
        self.world.trace(child.host.name, f"child {child.pid} committed batch {index}")

    def live_children(self) -> list[SimChild]:
        return list(self.live.values())

    def excused(self, host: Host, since: float, until: float) -> bool:
        """Whether a fault touched ``host``'s path (its database path, its process, its rows) in [since, until]."""
        if self.network.touched(host.name, since, until):
            return True
        return any(start <= until and end >= since for start, end in self.excuses.get(host.name, ()))

    def excuse(self, host: Host, start: float, end: float) -> None:
        self.excuses.setdefault(host.name, []).append((start, end))

    # --- runners ------------------------------------------------------------------------------------------

    def start_runner(self, at: float) -> Host:
        self._runner_number += 1
        name = f"runner-{self._runner_number}"
        timings = self.timings
        supervisor_faults = SessionFaults(self.world, self.network, cast(Host, None), "supervisor",
                                          timings.statement_seconds, timings.server_statement_seconds)
        bounds = timings.child_bounds()  # the children's session bounds, as production derives them
        child_faults = SessionFaults(self.world, self.network, cast(Host, None), "child", 0.0,
                                     bounds.statement_timeout_ms / 1000)
        session = self.db.session(lock_timeout_s=timings.server_statement_seconds, name=name, faults=supervisor_faults)
        child_session = self.db.session(lock_timeout_s=bounds.lock_timeout_ms / 1000, name=f"{name}/children",
                                        faults=child_faults)
        host = Host(self, name, self.world, session, child_session)
        supervisor_faults.host = child_faults.host = host
        self.hosts.append(host)
        host.actor = self.world.spawn(name, lambda: self._serve(host), at=at)
        return host

    def _serve(self, host: Host) -> None:
        rng = self.rng
        concurrency = rng.choice((1, 2, 2, 3))
        capabilities = sorted(rng.sample(WORKERS, rng.randint(2, len(WORKERS))))
        options = RunnerOptions(name=host.name, concurrency=concurrency, capabilities=tuple(capabilities),
                                **self.options_template).validate()
        runner_id = uuid.UUID(int=rng.getrandbits(128))
        registration = RunnerRegistration(
            runner_id=runner_id, name=host.name, hostname=host.name, pid=self.new_pid(), package_version="sim",
            schema_revision="sim", capabilities=capabilities, concurrency=concurrency,
            heartbeat_seconds=options.heartbeat_seconds, lease_seconds=options.lease_seconds,
            poll_seconds=options.poll_seconds, kind="daemon",
        )
        control = SimControl(self.world, host.poke)
        host.control = control
        sup = Supervisor(
            options, registration, host.fork_server, ChildSetup("simulated://", {}, CATALOGUE),
            services=Services(control=control),
            ledger=cast(Any, WriteCheck(host.ledger, runner_id, self.checker.report)),
            host=Ports(SimClock(host), SimWaiter(self.world), SimProcesses(host), lambda title: None,
                       install_signals=False),
        )
        host.supervisor = sup
        try:
            sup.open()
        except Exception as exc:  # the database did not answer the registration: the daemon exits (5)
            self.world.trace(host.name, f"did not start: {type(exc).__name__}")
            host.fork_server.close()
            self._replace(host)
            return
        host.serving = True
        self.world.trace(host.name, f"serving: concurrency {concurrency}, capabilities {','.join(capabilities)}")
        code = sup.serve()
        host.serving = False
        sup.close()
        self.world.trace(host.name, f"stopped (exit {code})")
        self._replace(host)

    def _replace(self, host: Host) -> None:
        """A runner that stopped (drained, killed, never started) is restarted, while runs still come."""
        if self.world.now < ACTIVE_SECONDS or not any(h.running for h in self.hosts if h is not host):
            self.start_runner(self.world.now + self.rng.uniform(0.5, 3.0))

    # --- the workload -------------------------------------------------------------------------------------

    def _enqueue(self) -> None:
        rng = self.rng
        worker = rng.choice(WORKERS)
        options = {"invalid": True} if rng.random() < 0.03 else {"n": rng.randint(1, 9)}
        try:
            run = self.api.enqueue(worker, {"options": options}, requested_by="sim")
            self.world.trace("api", f"enqueued {run.run_id} ({worker})")
        except WorkerRunAlreadyActive:
            pass
        if rng.random() < 0.08:
            active = self.db.active_runs()
            if active:
                victim = rng.choice(active)
                try:
                    self.api.request_cancel(victim.run_id, "sim")
                    self.world.trace("api", f"cancel requested for {victim.run_id}")
                except (RunNotFound, RunAlreadyFinished, DBAPIError):
                    pass  # finished meanwhile, or its row is locked by a frozen session: the API says so
        if self.world.now < ACTIVE_SECONDS:
            self.world.at(self.world.now + rng.expovariate(1.5), self._enqueue)

    def _status_query(self) -> None:
        running = [h for h in self.hosts if h.running and h.control is not None]
        if running:
            host = self.rng.choice(running)
            command = "drain" if self.rng.random() < 0.05 else "status"
            host.control.connect(Client({"command": command}))
            self.world.trace(host.name, f"control client: {command}")
        if self.world.now < ACTIVE_SECONDS:
            self.world.at(self.world.now + self.rng.uniform(0.5, 4.0), self._status_query)

    # --- the faults -----------------------------------------------------------------------------------

    def _inject(self, fault: Scheduled) -> None:
        world, kind, net = self.world, fault.kind, self.network
        hosts = [h for h in self.hosts if h.running]
        host = hosts[fault.host % len(hosts)] if hosts and fault.host is not None else None
        name = host.name if host is not None else None
        end = world.now + abs(fault.seconds)
        window_kinds = {"statement_hang": "hang", "slow_statements": "slow", "refused_connections": "refused",
                        "partition_one": "partition", "partition_all": "partition_all", "db_restart": "db_restart",
                        "db_failover": "db_failover", "answer_lost": "answer_lost"}
        if kind in window_kinds:
            if fault.host is not None and host is None:
                return
            rate = {"statement_hang": 0.5, "answer_lost": 0.3, "slow_statements": 0.7}.get(kind, 1.0)
            net.add(window_kinds[kind], Window(world.now, end, name, rate, seconds=3 * self.timings.statement_seconds))
            if kind in ("db_restart", "db_failover"):
                self._database_restarted()
        elif host is None:
            return
        elif kind == "row_lock_frozen_session":
            held = [r for r in self.db.runs.values() if r["status"] == "RUNNING"]
            if not held:
                return
            row = self.rng.choice(held)
            self.db.lock_row(row["run_id"], release_after_s=abs(fault.seconds))
            owner = next((h for h in self.hosts if h.supervisor is not None
                          and h.supervisor.runner_id == row["runner_id"]), None)
            if owner is not None:
                self.excuse(owner, world.now, end)
            name = owner.name if owner is not None else "?"
        elif kind == "fork_server_stop":
            host.fork_server.stop(abs(fault.seconds))
        elif kind == "fork_server_death":
            host.fork_server.die()
        elif kind == "runner_sigstop":
            if host.actor is None:
                return
            world.freeze(host.actor, end)
            self.excuse(host, world.now, end + self.timings.statement_seconds)
        elif kind == "runner_sigkill":
            host.kill()
            self.excuse(host, world.now, world.now)
            self._replace(host)
        elif kind == "control_client_never_reads":
            if host.control is None:
                return
            for _ in range(self.rng.randint(1, 4)):
                host.control.connect(Client(None))
        elif kind == "wall_clock_jump":
            host.wall_offset += fault.seconds
        self.faults.counts[kind] += 1
        world.trace(name or "world", f"FAULT {kind} for {abs(fault.seconds):.3f}s")

    def _settled(self) -> bool:
        """Every run ended (or is QUEUED for a worker no live runner claims) and no child lives."""
        if self.live:
            return False
        claimable = {w for h in self.hosts if h.supervisor is not None and h.running for w in h.supervisor.capabilities}
        return all(row["status"] not in ("RUNNING", "QUEUED") or
                   (row["status"] == "QUEUED" and row["worker_name"] not in claimable) for row in self.db.runs.values())

    def _database_restarted(self) -> None:
        """A restart ends every session: a child's open batch is lost with its connection."""
        for child in self.live_children():
            if child.batch is not None and getattr(child.batch, "open", False):
                child.batch.rollback()

    # --- the history ------------------------------------------------------------------------------------

    def run(self) -> SeedResult:
        world = self.world
        loggers = _quiet_loggers(self.world.trace_sink is None or self._quiet)
        try:
            for _ in range(self.rng.choice((2, 2, 3))):
                self.start_runner(self.rng.uniform(0.0, 0.5))
            world.at(self.rng.uniform(0.0, 1.0), self._enqueue)
            world.at(self.rng.uniform(0.5, 2.0), self._status_query)
            for fault in self.faults.schedule(3, ACTIVE_SECONDS):
                world.at(fault.at, functools.partial(self._inject, fault))
            world.run_until(ACTIVE_SECONDS)
            end = ACTIVE_SECONDS + self.settle_seconds
            while world.now < end and not self.stop_now and not self._settled():
                world.run_until(min(end, world.now + 0.5))  # the settle ends early once every run has ended
            if not self.stop_now:
                self.checker.check_end()
        finally:
            self._close()
            _restore_loggers(loggers)
        runs = Counter(str(row["status"]) for row in self.db.runs.values())
        return SeedResult(self.seed, world.steps, world.now, Counter(self.faults.counts), self.checker.violations,
                          self.digest, runs)

    def _close(self) -> None:
        for host in self.hosts:
            host.killed = True
            sup = host.supervisor
            if sup is not None:
                for child in list(sup.children.values()):
                    child.close()
        for child in list(self.children.values()):
            if child.alive:
                child.alive = False
                child.channel.close()
                _close_fd(child.output_fd)
        for host in self.hosts:
            for child in host.fork_server.children.values():
                if child.alive:
                    child.alive = False
                    child.channel.close()
                    _close_fd(child.output_fd)
        self.world.close()


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _quiet_loggers(quiet: bool) -> dict[str, tuple[int, bool]]:
    """The runner's loggers say nothing in a batch of seeds (the replay's trace shows them)."""
    saved = {}
    for name in ("scrinalia.runner", "scrinalia.runner.forkserver", "scrinalia.runner.control",
                 "scrinalia.runner.bounded"):
        logger = logging.getLogger(name)
        saved[name] = (logger.level, logger.propagate)
        if quiet:
            logger.setLevel(logging.CRITICAL + 1)
            logger.propagate = False
    return saved


def _restore_loggers(saved: dict[str, tuple[int, bool]]) -> None:
    for name, (level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate


def run_seed(seed: int, *, dials: Dials | None = None,
             trace: Callable[[float, str, str], None] | None = None) -> SeedResult:
    return Simulation(seed, dials=dials, trace=trace).run()


__all__ = ["FAULT_KINDS", "SeedResult", "Simulation", "run_seed"]
