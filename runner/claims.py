"""The poll phase: claim while a slot is free, and start each claimed run (decision 0090).

Per claimed run, in this order: resolve its request (``spec.resolve``, here, once: resolvers import no
engine, and this process never imports torch), write the fenced ``record_start`` (the row says what
runs before any worker code does), then start its child, whose assignment carries the resolved config.
A request that does not resolve ends FAILED ``configuration`` with no child; a database that does not
answer keeps the run *unstarted* (its lease is renewed by the heartbeat) until a later tick.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from runner import procinfo, wire
from runner.children import Child
from runner.devices import Placement, child_env
from runner.ledger_link import DatabaseDown
from runner.loop_state import SupervisorBase
from runner.outcome import format_error
from scrinalia.db.engine import ServerFacts
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.worker_settings import get_settings
from scrinalia.domains.archive.workers.sdk import DatabaseLayer, PersistedSettings, ResolvedConfig

log = logging.getLogger("scrinalia.runner")


class ConfigurationError(Exception):
    """The claimed run's request does not resolve here: FAILED ``configuration``, never retried."""


class Claims(SupervisorBase):
    def _may_claim(self) -> bool:
        return (
            not self.drain.draining
            and not self.lease.fenced
            and self.db.ok
            and self.launcher.healthy()
            and not self.launcher.stalled  # a spawn unanswered, or restarting (decision 0112)
            and len(self.children) + len(self.unstarted) < self.options.concurrency
        )

    def _phase_poll(self) -> None:
        if self.mode != "daemon" or time.monotonic() < self.timers.poll:
            return
        self.timers.poll = time.monotonic() + self._poll_interval()
        if self.db.unreachable:
            return  # the heartbeat's retry is the probe: our own rows are renewed before anything expires
        if time.monotonic() >= self.timers.expiry:
            self._expire_leases()
        if self.services.devices is not None and self.services.devices.devices and self.children:
            self._sample_resources()  # the memory rule reads what the children use now
        self._claim_while_free()

    def _claim_while_free(self) -> None:
        """One claim per free slot, each one statement; the first empty answer ends the round."""
        while self._may_claim():
            capabilities = self._claimable()
            if not capabilities:
                return  # every device slot is taken and no CPU-only worker is claimable
            try:
                run = self.db.call("claim", ledger.claim_next, self.runner_id, capabilities,
                                   self.options.lease_seconds)
            except DatabaseDown:
                return
            if run is None:
                return
            self.finisher.counters["claimed"] += 1
            self._begin(run, time.monotonic())

    # --- devices ---------------------------------------------------------------------------------------

    def _placements(self) -> list[Placement]:
        return [Placement(c.device.key, c.gpu_need_bytes, c.resources.gpu_bytes) for c in self.children.values()
                if c.device is not None]

    def device_status(self) -> list[dict[str, Any]]:
        """The owned devices, each with its slots and the children on it (``status``)."""
        devices = self.services.devices
        if devices is None:
            return []
        on: dict[str, list[int]] = {}
        for c in self.children.values():
            if c.device is not None:
                on.setdefault(c.device.key, []).append(c.pid)
        return [{**d.describe(), "memory_total_bytes": d.memory_total_bytes, "slots": devices.per_device,
                 "children": on.get(d.key, [])} for d in devices.devices]

    def _claimable(self) -> list[str]:
        """The capability list of the next claim: the device rule (``runner.devices``) decides which
        workers a free slot (and the free GPU memory) allows now; the claim stays one statement."""
        if self.services.devices is None:
            return self.capabilities
        return self.services.devices.claimable(self.capabilities, self._placements())

    # --- one claimed run: resolve, record_start, child -------------------------------------------------

    def _phase_unstarted(self) -> None:
        """Retry the runs whose resolution or record_start met a database that did not answer."""
        if not self.db.ok:
            return
        for run, claimed_at in list(self.unstarted.values()):
            del self.unstarted[run.run_id]
            self._begin(run, claimed_at)

    def _begin(self, run: WorkerRun, claimed_at: float) -> Child | None:
        try:
            resolved = self._resolve(run)
            held = self.db.call("record_start", ledger.record_start, run.run_id, self.runner_id,
                                **_record_start_fields(resolved))
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
        layer = None
        if spec.resolver is None and spec.engine_source != "llm_check_rule":
            # The settings on the warm connection, so the resolver reads nothing more (decision 0074).
            row = self.db.call("settings", get_settings, run.worker_name)
            layer = DatabaseLayer(settings={run.worker_name: PersistedSettings.from_row(row)})
        try:
            resolved: ResolvedConfig = spec.resolve(self.db.engine, run.request or {}, layer=layer)
        except SQLAlchemyError as exc:
            self.db.failed("resolve", exc)
            raise DatabaseDown("resolve") from None
        except Exception as exc:
            raise ConfigurationError(format_error(exc)) from None
        return resolved

    def _spawn(self, run: WorkerRun, resolved: ResolvedConfig, claimed_at: float) -> Child | None:
        devices = self.services.devices
        device = devices.place(run.worker_name, self._placements()) if devices is not None else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            # A stopped fork server must not hold the loop: its answer is waited for until the fence point.
            wait = max(0.02, self._bounded_wait(self.options.spawn_seconds))
            pid = self.launcher.spawn(theirs.fileno(), out_w, timeout=wait)
        except Exception as exc:
            ours.close()
            os.close(out_r)
            self.finisher.start_failed(run, exc)
            return None
        finally:
            theirs.close()
            os.close(out_w)
        os.set_blocking(out_r, False)
        child = Child(run=run, pid=pid, channel=ours, output_fd=out_r, claimed_at=claimed_at, device=device,
                      gpu_need_bytes=devices.need(run.worker_name).memory_bytes
                      if devices is not None and device is not None else None)
        child.resources.oom_kills_at_start = procinfo.oom_kill_counter()
        self.children[pid] = child
        try:
            wire.send(ours, "assign", self._assignment(run, resolved, device))
        except OSError as exc:
            log.error("run %s: the child %d did not take its assignment: %s", run.run_id, pid, exc)
        ours.setblocking(False)
        log.info("run %s (%s) -> child %d%s", run.run_id, run.worker_name, pid,
                 f" on GPU {device.key}" if device is not None else "")
        return child

    def _assignment(self, run: WorkerRun, resolved: ResolvedConfig, device: Any) -> dict[str, Any]:
        facts = ServerFacts.of(self.db.engine)
        return {
            "run": run,
            "config": resolved,  # already written by record_start: the child runs exactly this
            "env": child_env(device) if self.services.devices is not None else {},
            "database_url": self.setup.database_url,
            "connect_args": self.setup.connect_args,
            # What the child's engine would otherwise ask its first connection (decision 0073).
            "server_facts": facts.to_json() if facts is not None else None,
            "preload": list(self.launcher.child_preload),
        }


def _record_start_fields(resolved: ResolvedConfig) -> dict[str, Any]:
    """What ``record_start`` writes of a resolution: the engine's config with the run's batch size,
    engine options and the source of each field."""
    config = dict(resolved.config)
    for key in ("db_batch_size", "engine_options", "sources"):
        config.setdefault(key, getattr(resolved, key))
    return {"engine_name": resolved.engine_name, "preset": resolved.preset, "config": config,
            "options": resolved.options}
