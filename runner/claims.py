"""Claiming and starting runs: phase ``poll`` (``Poll``) and phase ``unstarted`` (``Starts``).

Per claimed run, in this order (decision 0090): resolve its request (``spec.resolve``, here, once:
resolvers import no engine, and this process never imports torch), write the fenced ``record_start``
(the row says what runs before any worker code does), then start its child, whose assignment carries
the resolved config. A request that does not resolve ends FAILED ``configuration`` with no child; a
database that does not answer keeps the run *unstarted* (its lease is renewed by the heartbeat) until a
later tick; a launcher that does not start the child (a stopped or restarting fork server) keeps it
*waiting for the launcher*: no worker code ran, so the run is not failed, it is spawned again when the
launcher answers (decision 0136).
"""
from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from runner import wire
from runner.child import ENGINE_FIELDS
from runner.children import Child
from runner.devices import DevicePlanner, Placement, child_env
from runner.drain import Drain
from runner.finisher import Finisher
from runner.launchers import Launcher, LauncherNotReady
from runner.lease import Lease
from runner.ledger_link import DatabaseDown, LedgerLink
from runner.loop_state import ChildSetup
from runner.outcome import format_error
from runner.ports import Clock, Host
from runner.tending import Children, Sampler
from runner.timings import SPAWN_WAIT_MIN, Timings
from scrinalia.domains.archive.ledger import StartParams, WorkerRun
from scrinalia.domains.archive.workers.sdk import DatabaseLayer, PersistedSettings, ResolvedConfig
from scrinalia.journal import run_fields

log = logging.getLogger("scrinalia.runner")


class ConfigurationError(Exception):
    """The claimed run's request does not resolve here: FAILED ``configuration``, never retried."""


@dataclass(slots=True)
class Waiting:
    """A claimed run whose child the launcher did not start: resolved, ``record_start`` written."""

    run: WorkerRun
    resolved: ResolvedConfig
    claimed_at: float


@dataclass(frozen=True, slots=True)
class StartsConfig:
    """What the ``unstarted`` phase is told: whose runs it starts, with what, on which devices."""

    runner_id: uuid.UUID
    timings: Timings
    setup: ChildSetup
    devices: DevicePlanner | None = None  # None (the one-shot CLI): the child sees what the shell sees


class Starts:
    """Phase ``unstarted``: the claimed runs without a child yet, and how a run gets its child."""

    name = "unstarted"

    def __init__(self, host: Host, config: StartsConfig, db: LedgerLink, launcher: Launcher, finisher: Finisher,
                 children: Children, lease: Lease, drain: Drain) -> None:
        self.clock = host.clock
        self.processes = host.processes
        self.timings = config.timings
        self.runner_id = config.runner_id
        self.setup = config.setup
        self.devices = config.devices
        self.db = db
        self.launcher = launcher
        self.finisher = finisher
        self.children = children
        self.lease = lease
        self.drain = drain
        self.unstarted: dict[uuid.UUID, tuple[WorkerRun, float]] = {}  # resolve/record_start wait for the database
        self.waiting: dict[uuid.UUID, Waiting] = {}  # the launcher did not start their child

    @property
    def count(self) -> int:
        return len(self.unstarted) + len(self.waiting)

    def run(self) -> None:
        """Retry the runs whose resolution or record_start met a database that did not answer, and the
        spawns the launcher did not answer once it answers again."""
        if self.db.ok:
            for run, claimed_at in list(self.unstarted.values()):
                del self.unstarted[run.run_id]
                self.begin(run, claimed_at)
        for wait in list(self.waiting.values()):
            if self.launcher_ready() and self.db.ok and not self.lease.fenced:
                del self.waiting[wait.run.run_id]
                self._retry_spawn(wait)
        if self.waiting and self._drain_over():
            for wait in list(self.waiting.values()):
                del self.waiting[wait.run.run_id]
                self.finisher.not_started(wait.run, "the launcher did not start its child before the runner stopped")

    def _drain_over(self) -> bool:
        return self.drain.draining and self.drain.deadline is not None and self.clock.monotonic() >= self.drain.deadline

    def due(self) -> list[float]:
        moments = [self.clock.monotonic()] if self.unstarted and self.db.ok else []
        if self.waiting and self.drain.draining and self.drain.deadline is not None:
            moments.append(self.drain.deadline)
        return moments

    def _retry_spawn(self, wait: Waiting) -> None:
        """The launcher answers again: the run is spawned if it is still ours. ``record_start`` again (the
        same fields: idempotent) is the fenced check, since the lease may have passed meanwhile."""
        try:
            held = self.db.call("record_start", self.db.ledger.record_start, wait.run.run_id, self.runner_id,
                                _record_start_fields(wait.resolved))
        except DatabaseDown:
            self.waiting[wait.run.run_id] = wait
            return
        if not held:
            self.finisher.lost(wait.run, "its row was not ours any more when the launcher answered; no child")
            return
        self._spawn(wait.run, wait.resolved, wait.claimed_at)

    def launcher_ready(self) -> bool:
        """The launcher answers and no spawn request is unanswered (decision 0112)."""
        return self.launcher.healthy() and not self.launcher.stalled

    @property
    def busy(self) -> int:
        """The slots taken: the children, and the claimed runs without one yet."""
        return len(self.children) + self.count

    def claimed(self, run: WorkerRun) -> None:
        """A run the poll claimed: counted, then started."""
        self.finisher.counters["claimed"] += 1
        self.begin(run, self.clock.monotonic())

    def held(self, held: Mapping[uuid.UUID, Any]) -> None:
        """The heartbeat's answer: a claimed run it did not renew is not ours any more."""
        for run_id, (run, _) in list(self.unstarted.items()):
            if run_id not in held:
                del self.unstarted[run_id]
                self.finisher.lost(run, "its row was not renewed before its child started")
        for run_id, wait in list(self.waiting.items()):
            if run_id not in held:
                del self.waiting[run_id]
                self.finisher.lost(wait.run, "its row was not renewed while its child waited for the launcher")

    def begin(self, run: WorkerRun, claimed_at: float, resolved: ResolvedConfig | None = None) -> Child | None:
        """Resolve ``run`` (unless ``resolved``: the one-shot's validation did, a moment ago), write
        ``record_start``, start its child."""
        try:
            if resolved is None:
                resolved = self._resolve(run)
            held = self.db.call("record_start", self.db.ledger.record_start, run.run_id, self.runner_id,
                                _record_start_fields(resolved))
        except DatabaseDown:
            self.unstarted[run.run_id] = (run, claimed_at)
            return None
        except ConfigurationError as exc:
            self.finisher.configuration_failed(run, str(exc))
            return None
        if not held:
            self.finisher.lost(run, "record_start touched no row; no child started")
            return None
        return self._spawn(run, resolved, claimed_at)

    def _resolve(self, run: WorkerRun) -> ResolvedConfig:
        """The run's effective configuration. Raises ``ConfigurationError`` or ``DatabaseDown``."""
        if self.setup.catalogue is None:
            from scrinalia.domains.archive.workers.plugins import load_catalogue

            self.setup.catalogue = load_catalogue()
        spec = self.setup.catalogue.get(run.worker_name)
        if spec is None:
            raise ConfigurationError(f"UnknownWorker: no worker named {run.worker_name!r} in this runner's catalogue")
        # What the resolver reads of the database, read here through the port on the warm connection
        # (decisions 0074, 0351): the worker's persisted settings and, for a worker whose engine is the
        # LLM_CHECK rule's, that rule. The resolver, default or custom, is given no engine.
        row = self.db.call("settings", self.db.ledger.worker_settings, run.worker_name)
        rule = (self.db.call("llm_check_rule", self.db.ledger.llm_check_rule)
                if spec.engine_source == "llm_check_rule" else None)
        layer = DatabaseLayer(settings={run.worker_name: PersistedSettings.from_row(row)}, llm_check_rule=rule)
        try:
            resolved: ResolvedConfig = spec.resolve(None, run.request or {}, layer=layer)
        except SQLAlchemyError as exc:
            self.db.failed("resolve", exc)
            raise DatabaseDown("resolve") from None
        except Exception as exc:
            raise ConfigurationError(format_error(exc)) from None
        return resolved

    def placements(self) -> list[Placement]:
        return [Placement(c.device.key, c.gpu_need_bytes, c.resources.gpu_bytes) for c in self.children.values()
                if c.device is not None]

    def _spawn(self, run: WorkerRun, resolved: ResolvedConfig, claimed_at: float) -> Child | None:
        devices = self.devices
        device = devices.place(run.worker_name, self.placements()) if devices is not None else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            # A stopped fork server must not hold the loop: its answer is waited for until the fence point.
            wait = max(SPAWN_WAIT_MIN, self.lease.bounded_wait(self.timings.spawn_seconds))
            pid = self.launcher.spawn(theirs.fileno(), out_w, timeout=wait)
        except Exception as exc:
            ours.close()
            os.close(out_r)
            if isinstance(exc, LauncherNotReady):
                log.warning("run %s (%s): %s; it waits for the launcher (no worker code ran)",
                            run.run_id, run.worker_name, exc, extra=run_fields(run))
                self.waiting[run.run_id] = Waiting(run, resolved, claimed_at)
            else:
                self.finisher.start_failed(run, exc)
            return None
        finally:
            theirs.close()
            os.close(out_w)
        os.set_blocking(out_r, False)
        child = Child(run=run, pid=pid, channel=ours, output_fd=out_r, claimed_at=claimed_at, device=device,
                      gpu_need_bytes=devices.need(run.worker_name).memory_bytes
                      if devices is not None and device is not None else None)
        child.resources.oom_kills_at_start = self.processes.oom_kill_counter()
        self.children[pid] = child
        assignment = self._assignment(run, resolved, device)
        try:
            wire.send(ours, "assign", assignment)
        except OSError as exc:
            log.error("run %s: the child %d did not take its assignment: %s", run.run_id, pid, exc,
                      extra=run_fields(run))
        self.launcher.set_prepare({k: assignment[k] for k in ENGINE_FIELDS})  # the next standby child (0341)
        ours.setblocking(False)
        log.info("run %s (%s) -> child %d%s", run.run_id, run.worker_name, pid,
                 f" on GPU {device.key}" if device is not None else "", extra=run_fields(run))
        return child

    def _assignment(self, run: WorkerRun, resolved: ResolvedConfig, device: Any) -> dict[str, Any]:
        facts = self.db.ledger.server_facts()
        return {
            "run": run,
            "config": resolved,  # already written by record_start: the child runs exactly this
            "env": child_env(device) if self.devices is not None else {},
            "database_url": self.setup.database_url,
            "connect_args": self.setup.connect_args,
            # What the child's engine would otherwise ask its first connection (decision 0073).
            "server_facts": facts.to_json() if facts is not None else None,
            "preload": list(self.launcher.child_preload),
        }


@dataclass(frozen=True, slots=True)
class PollConfig:
    """What the ``poll`` phase is told: whose claims, for which workers, how many at once, how often."""

    runner_id: uuid.UUID
    capabilities: list[str]
    concurrency: int
    timings: Timings
    devices: DevicePlanner | None = None  # the device rule of each claim (None: every slot is alike)


class Poll:
    """Phase ``poll``: ``expire_leases`` on its cadence, then one claim per free slot (the daemon's loop only:
    the one-shot CLI claims nothing). A claimed run goes to ``Starts``, whose table of children it fills."""

    name = "poll"

    def __init__(self, clock: Clock, config: PollConfig, db: LedgerLink, starts: Starts, lease: Lease,
                 drain: Drain, wakeup: Any, sampler: Sampler) -> None:
        self.clock = clock
        self.timings = config.timings
        self.runner_id = config.runner_id
        self.capabilities = config.capabilities
        self.concurrency = config.concurrency
        self.devices = config.devices
        self.db = db
        self.starts = starts
        self.lease = lease
        self.drain = drain
        self.wakeup = wakeup  # runner.wakeup.Wakeup (None: poll only)
        self.sampler = sampler
        self.next_at = 0.0
        self.next_expiry = 0.0

    def may_claim(self) -> bool:
        return (
            not self.drain.draining
            and not self.lease.fenced
            and not self.lease.within_margin()  # fenced at the fence phase's next turn
            and self.db.ok
            and self.starts.launcher_ready()  # a spawn unanswered, or restarting (decision 0112)
            and self.starts.busy < self.concurrency
        )

    def claim_now(self) -> None:
        self.next_at = min(self.next_at, self.clock.monotonic())

    def interval(self) -> float:
        """While the LISTEN is up the poll is only the safety net (``Timings.listening_poll``); without
        the LISTEN: --poll."""
        wakeup = self.wakeup
        if wakeup is not None and wakeup.listening:
            return self.timings.listening_poll()
        return self.timings.poll

    def due(self) -> list[float]:
        return [self.next_at] if not self.drain.draining else []

    def run(self) -> None:
        now = self.clock.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.interval()
        if self.db.unreachable:
            return  # the heartbeat's retry is the probe: our own rows are renewed before anything expires
        if now >= self.next_expiry:
            self.expire_leases()
        if self.devices is not None and self.devices.devices and self.starts.children:
            self.sampler.sample()  # the memory rule reads what the children use now
        self._claim_while_free()

    def expire_leases(self) -> None:
        self.next_expiry = self.clock.monotonic() + self.timings.expiry_seconds
        try:
            expired = self.db.call("expire_leases", self.db.ledger.expire_leases)
        except DatabaseDown:
            return
        for run in expired:
            log.warning("run %s (%s) of runner %s: lease expired -> INTERRUPTED", run.run_id,
                        run.worker_name, run.runner_id, extra=run_fields(run))

    def _claim_while_free(self) -> None:
        """One claim per free slot, each one statement; the first empty answer ends the round."""
        while self.may_claim():
            capabilities = self._claimable()
            if not capabilities:
                return  # every device slot is taken and no CPU-only worker is claimable
            try:
                run = self.db.call("claim", self.db.ledger.claim_next, self.runner_id, capabilities,
                                   self.timings.lease)
            except DatabaseDown:
                return
            if run is None:
                return
            self.starts.claimed(run)

    def _claimable(self) -> list[str]:
        """The capability list of the next claim: the device rule (``runner.devices``) decides which
        workers a free slot (and the free GPU memory) allows now; the claim stays one statement."""
        if self.devices is None:
            return self.capabilities
        return self.devices.claimable(self.capabilities, self.starts.placements())

    def device_status(self) -> list[dict[str, Any]]:
        """The owned devices, each with its slots and the children on it (``status``)."""
        devices = self.devices
        if devices is None:
            return []
        on: dict[str, list[int]] = {}
        for c in self.starts.children.values():
            if c.device is not None:
                on.setdefault(c.device.key, []).append(c.pid)
        return [{**d.describe(), "memory_total_bytes": d.memory_total_bytes, "slots": devices.per_device,
                 "children": on.get(d.key, [])} for d in devices.devices]


def _record_start_fields(resolved: ResolvedConfig) -> StartParams:
    """What ``record_start`` writes of a resolution: the engine's config with the run's batch size,
    engine options and the source of each field."""
    config = dict(resolved.config)
    for key in ("db_batch_size", "engine_options", "sources"):
        config.setdefault(key, getattr(resolved, key))
    return StartParams(resolved.engine_name, resolved.preset, config, resolved.options)
