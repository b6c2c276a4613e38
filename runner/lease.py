"""The phases that keep the lease: the self-fence, the heartbeat, progress, notifications.

* ``Lease``: what the last heartbeat said about the lease, and its fence point; every wait of the loop and
  every statement ends by it (decision 0110);
* ``Fence`` (phase ``fence``): when the lease could not be renewed before ``lease - fence_margin``, SIGKILL
  every child and claim nothing until the database answers (the children are dead before another runner
  may expire their rows). It runs at its place in the loop, and between two phases when a statement met
  the fence point (the request ``fence``; decision 0312), never inside another phase;
* ``Heartbeat``: ONE statement per interval renews the registry row and every RUNNING row of this
  runner; a row missing from its answer is lost (SIGKILL that child, write nothing more), a cancel
  request in it is handed to the child, and the answer settles the finisher's abandoned runs;
* ``ProgressWriter``: ONE statement for every child whose progress changed, at most every
  PROGRESS_INTERVAL;
* ``Notifications`` (phase ``wakeup``): a LISTEN notification is a request for a claim (or a beat) now.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.drain import Drain
from runner.ledger_link import DatabaseDown, LedgerLink
from runner.loop_state import Requests
from runner.ports import Clock
from runner.run_state import RunPhase
from runner.tending import Children, Effects, Sampler
from runner.timings import PROGRESS_INTERVAL, Timings
from runner.warm_models import registry_view

log = logging.getLogger("scrinalia.runner")


class Lease:
    """The lease as the last heartbeat left it; its fence point bounds every wait and every statement."""

    def __init__(self, clock: Clock, timings: Timings, children: Children) -> None:
        self.clock = clock
        self.timings = timings
        self.children = children
        self.deadline: float | None = None   # CLOCK_MONOTONIC: the lease ends (conservative by the round trip)
        self.last_ok: float | None = None
        self.fenced = False                  # the lease could not be renewed in time: no claims

    def margin(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - self.clock.monotonic()

    def fence_point(self) -> float | None:
        """When the children must be dead if the lease is not renewed (None: no live child to fence).
        Every wait of the loop ends by then (decision 0110)."""
        if self.deadline is None or not any(c.state.alive for c in self.children.values()):
            return None
        return self.deadline - self.timings.fence_margin

    def within_margin(self) -> bool:
        """The lease could not be renewed before ``lease - fence_margin``: the fence phase fences at its next
        turn, and nothing is claimed meanwhile (with a child or without)."""
        return self.margin() <= self.timings.fence_margin

    def past_fence_point(self) -> bool:
        """A live child's fence point is reached: nothing more is sent until the fence phase ran."""
        point = self.fence_point()
        return point is not None and self.clock.monotonic() >= point

    def bounded_wait(self, seconds: float) -> float:
        """``seconds``, clipped to the fence point: how long the loop may wait on anything now."""
        point = self.fence_point()
        return seconds if point is None else max(0.0, min(seconds, point - self.clock.monotonic()))

    def renewed(self, sent: float, lease_seconds_left: float) -> None:
        """A heartbeat sent at ``sent`` renewed the lease for ``lease_seconds_left`` (the database's
        clock: lease_expires_at - now). Measured from before the statement was sent: conservative."""
        self.last_ok = sent
        self.deadline = sent + lease_seconds_left
        if self.fenced:
            log.warning("the database answers again: claiming resumes")
            self.fenced = False


class Fence:
    """Phase ``fence``: the self-fence (decision 0012), from the lease and the table of children."""

    name = "fence"

    def __init__(self, lease: Lease, children: Children, effects: Effects) -> None:
        self.lease = lease
        self.children = children
        self.effects = effects

    def run(self) -> None:
        lease = self.lease
        if not lease.within_margin():
            return
        margin = lease.margin()
        live = [c for c in self.children.values() if c.state.alive]
        if not lease.fenced and live:
            log.critical(
                "self-fence: the lease could not be renewed in time (%.1fs of margin left); killing %d children "
                "and claiming nothing until the database answers", margin, len(live),
            )
        elif not lease.fenced:
            log.warning("the lease could not be renewed in time; claiming nothing until the database answers")
        lease.fenced = True
        for child in live:
            self.effects.fence(child)

    def due(self) -> list[float]:
        """The fence point while a live child has one. Not once the children were fenced: a killed child
        whose exit report is late (a stopped fork server) must not make the loop spin on a past moment."""
        point = self.lease.fence_point()
        return [] if point is None else [point]


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    """What the heartbeat phase is told: whose rows it renews, and for how long."""

    runner_id: uuid.UUID
    timings: Timings
    warm: Callable[[], dict[str, Any]] = field(default=dict)  # the launcher's warm models now (decision 0381)


class Heartbeat:
    """Phase ``heartbeat``: ONE statement per interval (``ledger.heartbeat``)."""

    name = "heartbeat"

    def __init__(self, clock: Clock, config: HeartbeatConfig, db: LedgerLink, lease: Lease, children: Children,
                 effects: Effects, drain: Drain, sampler: Sampler) -> None:
        self.clock = clock
        self.timings = config.timings
        self.db = db
        self.runner_id = config.runner_id
        self.lease = lease
        self.children = children
        self.effects = effects
        self.drain = drain
        self.sampler = sampler
        self.next_at = 0.0
        self.last_children: list[dict[str, Any]] | None = None  # the registry's snapshot, as last written
        self.warm = config.warm
        self.last_warm: dict[str, Any] | None = None  # as last written

    def run(self) -> None:
        if self.clock.monotonic() >= self.next_at:
            self.beat()

    def due(self) -> list[float]:
        return [self.next_at]

    def beat_now(self) -> None:
        self.next_at = min(self.next_at, self.clock.monotonic())

    def beat(self) -> None:
        sent = self.clock.monotonic()
        self.sampler.sample()
        progress, snapshot = self._payload(sent)
        warm = registry_view(self.warm())
        try:
            # An unchanged snapshot (an idle runner's []) is not sent: the row keeps the one it has.
            beat = self.db.call(
                "heartbeat", self.db.ledger.heartbeat, self.runner_id, self.timings.lease,
                progress=progress, children=None if snapshot == self.last_children else snapshot,
                warm=None if warm == self.last_warm else warm,
            )
        except DatabaseDown:
            self.next_at = sent + self.timings.heartbeat_retry
            return
        self.last_children = snapshot
        self.last_warm = warm
        self.next_at = sent + self.timings.heartbeat
        self.lease.renewed(sent, (beat.lease_expires_at - beat.db_now).total_seconds())
        if not beat.registry_renewed:
            log.error("the registry row %s is gone; runs stay fenced by runner_id", self.runner_id)
        self._apply_held(beat.held)
        if beat.drain_requested_at is not None and not self.drain.draining:
            self.drain.begin("drain requested in the registry")

    def _payload(self, now: float) -> tuple[dict[uuid.UUID, Any], list[dict[str, Any]]]:
        """The progress of every child whose row is still ours, and the registry's snapshot of them."""
        live = [c for c in self.children.values() if c.state.phase is not RunPhase.LOST]
        return {c.run.run_id: c.progress for c in live if c.progress}, [c.snapshot(now) for c in live]

    def _apply_held(self, held: Mapping[uuid.UUID, Any]) -> None:
        """The rows the heartbeat renewed (with their cancel requests): lose the others, hand the
        cancels over; the rows go to the unstarted claims and the finisher's abandoned runs as a request."""
        for child in list(self.children.values()):
            if not child.state.alive:
                continue
            if child.run.run_id not in held:
                self.effects.lose(child, "its row was not renewed by the heartbeat "
                                         "(expired or taken by another runner)")
            elif held[child.run.run_id] is not None and child.state.cancel_sent_at is None:
                self.effects.request_cancel(child, "cancel requested")
        # The claimed runs without a child yet (``Starts.held``) and the finisher's abandoned runs
        # (``Finisher.settle``) check it, handed over by the loop right after this phase.
        self.effects.requests.held = held


class ProgressWriter:
    """Phase ``progress``: ONE statement for every child whose progress changed, at most every
    PROGRESS_INTERVAL; separate from the heartbeat, whose cadence is the lease's (decision 0082)."""

    name = "progress"

    def __init__(self, clock: Clock, db: LedgerLink, runner_id: uuid.UUID, children: Children) -> None:
        self.clock = clock
        self.db = db
        self.runner_id = runner_id
        self.children = children
        self.next_at = 0.0

    def pending(self) -> dict[uuid.UUID, dict[str, Any]]:
        return {c.run.run_id: c.progress for c in self.children.values()
                if c.progress is not None and c.progress != c.progress_written and c.state.alive}

    def due(self) -> list[float]:
        return [self.next_at] if not self.db.unreachable and self.pending() else []

    def run(self) -> None:
        now = self.clock.monotonic()
        if now < self.next_at or self.db.unreachable:
            return
        pending = self.pending()
        if not pending:
            return
        self.next_at = now + PROGRESS_INTERVAL
        try:
            self.db.call("record_progress", self.db.ledger.record_progress, self.runner_id, pending)
        except DatabaseDown:
            return
        for child in self.children.values():
            if child.run.run_id in pending:
                child.progress_written = pending[child.run.run_id]


class Notifications:
    """Phase ``wakeup``: a QUEUED run we can claim was announced (or the LISTEN restarted): poll now. A
    cancel request for a child that was not told yet: beat now, the heartbeat's answer hands it over."""

    name = "wakeup"

    def __init__(self, clock: Clock, wakeup: Any, children: Children, requests: Requests) -> None:
        self.clock = clock
        self.wakeup = wakeup
        self.children = children
        self.requests = requests

    def run(self) -> None:
        if self.wakeup is None:
            return
        news = self.wakeup.read(self.clock.monotonic())
        if news.claim:
            self.requests.claim = True
        if any(c.run.run_id in news.cancelled and c.state.cancel_sent_at is None for c in self.children.values()):
            self.requests.beat = True

    def due(self) -> list[float]:
        return [self.wakeup.due_at()] if self.wakeup is not None else []
