"""The invariants, checked after every step of a history (and those about its end, at its end).

Each one names a guarantee of the runner (docs/architecture.md, "The simulator"):

* ``one_active_row_per_worker``: at most one QUEUED-or-RUNNING row per worker (the slot);
* ``no_two_live_children``: no run executed by two live children (of running supervisors) at once, so
  none after its lease ended elsewhere;
* ``child_dead_before_lease_end``: a live child's row is held by its runner and leased, whatever the
  network does (the self-fence kills it before the true lease end when its runner cannot renew);
* ``write_only_held_rows``: no ledger write by a runner that does not hold the row (``WriteCheck``);
* ``no_batch_after_lease``: no archive batch committed at or after its run's lease end;
* ``terminal_or_leased_at_end``: at the end, every run is terminal, or RUNNING, leased and held by a
  live runner;
* ``free_runner_claims_within_poll``: a free runner claims a claimable QUEUED row within its poll;
* ``no_fence_without_fault``: a runner self-fences only when a fault touched its database path, its
  host, or its rows within the last lease (a fence out of nothing is the heartbeat waiting on itself).

A child of a SIGSTOPped supervisor is outside the first two until just after the thaw: nothing in a
stopped process can kill it; the batch fence keeps what it does harmless (``no_batch_after_lease``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.timings import CONTROL_SERVE_BUDGET

if TYPE_CHECKING:
    from runner.simulation.history import Simulation
    from runner.simulation.processes import Host

TERMINAL = ("SUCCESS", "FAILED", "CANCELLED", "INTERRUPTED")

INVARIANTS = (
    "one_active_row_per_worker", "no_two_live_children", "child_dead_before_lease_end", "write_only_held_rows",
    "no_batch_after_lease", "terminal_or_leased_at_end", "free_runner_claims_within_poll",
    "no_fence_without_fault",
)


@dataclass(frozen=True, slots=True)
class Violation:
    seed: int
    invariant: str
    step: int
    at: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "invariant": self.invariant, "step": self.step,
                "virtual_seconds": round(self.at, 6), "detail": self.detail}


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.violations: list[Violation] = []
        self._batches_seen = 0
        self._free_since: dict[str, float] = {}
        self._fenced: dict[str, bool] = {}
        self._statements_seen = -1
        self._queued: list[dict[str, Any]] = []

    def report(self, invariant: str, detail: str) -> None:
        world = self.sim.world
        self.violations.append(Violation(world.seed, invariant, world.steps, world.now, detail))
        world.trace("INVARIANT", f"{invariant} VIOLATED: {detail}")
        self.sim.stop_now = True

    # --- after every step -------------------------------------------------------------------------------

    def check_step(self) -> None:
        if self.sim.stop_now:
            return
        statements = self.sim.db.statements
        if statements != self._statements_seen:  # only a statement changes rows
            self._statements_seen = statements
            self._slots()
            self._queued = [row for row in self.sim.db.runs.values() if row["status"] == "QUEUED"]
        self._children()
        self._batches()
        self._free_runners()
        self._fences()

    def _slots(self) -> None:
        rows = self.sim.db.runs.values()
        active = Counter(row["worker_name"] for row in rows if row["status"] in ("QUEUED", "RUNNING"))
        for worker, count in active.items():
            if count > 1:
                self.report("one_active_row_per_worker", f"{count} active rows for worker {worker}")

    def _exempt(self, host: Host) -> bool:
        """A stopped supervisor (and the moment after its thaw, while its loop reaches its fence)."""
        if host.killed or host.stopped:
            return True
        thawed = host.thawed_at
        return thawed is not None and self.sim.world.now - thawed <= self.sim.timings.statement_seconds + 0.01

    def _children(self) -> None:
        sim = self.sim
        now = sim.world.db_now()
        live: Counter[Any] = Counter()
        for child in sim.live.values():
            if child.run_id is None or self._exempt(child.host):
                continue
            live[child.run_id] += 1
            row = sim.db.by_run_id.get(child.run_id)
            if row is None or row["status"] != "RUNNING" or row["runner_id"] != child.runner_id \
                    or row["lease_expires_at"] <= now:
                state = ("gone" if row is None
                         else f"{row['status']} by {row['runner_id']} until {row['lease_expires_at']}")
                self.report("child_dead_before_lease_end",
                            f"child {child.pid} of {child.host.name} alive, its run {child.run_id} is {state} at {now}")
        for run_id, count in live.items():
            if count > 1:
                self.report("no_two_live_children", f"run {run_id} has {count} live children")

    def _batches(self) -> None:
        batches = self.sim.db.committed_batches
        for batch in batches[self._batches_seen:]:
            if batch.committed_at >= batch.lease_expires_at:
                self.report("no_batch_after_lease", f"run {batch.run_id}: batch committed at {batch.committed_at}, "
                                                    f"lease until {batch.lease_expires_at}")
        self._batches_seen = len(batches)

    def _free_runners(self) -> None:
        sim = self.sim
        now = sim.world.now
        queued = self._queued
        if not queued and not self._free_since:
            return
        db_now = sim.world.db_now()
        queued = [row for row in queued if row["not_before"] is None or row["not_before"] <= db_now]
        for host in sim.hosts:
            sup = host.supervisor
            free = (sup is not None and queued and host.serving and not host.stopped and not host.killed
                    and any(row["worker_name"] in sup.capabilities for row in queued)
                    and sup.poll.may_claim())
            if not free:
                self._free_since.pop(host.name, None)
                continue
            since = self._free_since.setdefault(host.name, now)
            if sim.excused(host, since, now):
                self._free_since[host.name] = now
                continue
            allowed = sup.poll.interval() + CONTROL_SERVE_BUDGET + 2 * sim.timings.statement_seconds
            if now - since > allowed:
                self.report("free_runner_claims_within_poll",
                            f"{host.name} free for {now - since:.3f}s with a claimable QUEUED row "
                            f"(poll {sup.poll.interval():g}s)")

    def _fences(self) -> None:
        sim = self.sim
        for host in sim.hosts:
            sup = host.supervisor
            fenced = sup is not None and sup.lease.fenced
            if fenced and not self._fenced.get(host.name, False):
                now = sim.world.now
                if not sim.excused(host, now - sim.timings.lease - sim.timings.statement_seconds, now):
                    self.report("no_fence_without_fault", f"{host.name} self-fenced with no fault on its path")
            self._fenced[host.name] = fenced

    # --- at the end ------------------------------------------------------------------------------------

    def check_end(self) -> None:
        if self.sim.stop_now:
            return
        sim = self.sim
        now = sim.world.db_now()
        serving = [host.supervisor for host in sim.hosts
                   if host.supervisor is not None and host.running and not host.stopped]
        live = {sup.runner_id for sup in serving}
        claimable = {worker for sup in serving for worker in sup.capabilities}
        for row in sim.db.runs.values():
            if row["status"] in TERMINAL:
                continue
            if row["status"] == "QUEUED" and row["worker_name"] not in claimable:
                continue  # no live runner claims this worker: the world's shape, not the runner's fault
            if row["status"] == "RUNNING" and row["lease_expires_at"] > now and row["runner_id"] in live:
                continue
            self.report("terminal_or_leased_at_end",
                        f"run {row['run_id']} ({row['worker_name']}) {row['status']} at the end "
                        f"(runner {row['runner_id']}, lease until {row['lease_expires_at']})")
