"""Each phase of the supervisor alone, on the in-memory ledger and a clock the test moves (decision 0130):
no process, no database server, no loop."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from runner.drain import Drain
from runner.finisher import Finisher
from runner.lease import Heartbeat, Lease
from runner.ledger_link import LedgerLink
from runner.memory_ledger import MemoryDatabase
from runner.options import RunnerOptions
from runner.ports import SystemProcesses
from runner.tending import Effects, Sampler
from scrinalia.domains.archive.registry import RunnerRegistration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 0.0


def _registration(runner_id: uuid.UUID) -> RunnerRegistration:
    return RunnerRegistration(runner_id=runner_id, name="t", hostname="h", pid=1, package_version="t",
                              schema_revision=None, capabilities=["w"], concurrency=1, heartbeat_seconds=1.0,
                              lease_seconds=4.0)


def _phases(db: MemoryDatabase, clock: ManualClock, runner_id: uuid.UUID) -> tuple[Heartbeat, Lease, Drain]:
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0).validate().timings
    link = LedgerLink(db.session(lock_timeout_s=timings.server_statement_seconds))
    children: dict[int, Any] = {}
    finisher = Finisher(clock, link, runner_id, timings, "spawn", SystemProcesses())
    drain = Drain(clock, timings.drain_timeout, None, lambda: 0)
    effects = Effects(clock, children, SystemProcesses(), finisher, timings)
    lease = Lease(clock, timings, children, effects)
    link.fence_point, link.fence_check = lease.fence_point, lease.run
    beat = Heartbeat(clock, timings, link, runner_id, lease, children, effects, finisher, drain,
                     Sampler(children, SystemProcesses(), None))
    return beat, lease, drain


def test_the_heartbeat_renews_the_lease_on_the_database_clock_and_hands_over_a_drain_request():
    seconds = [0.0]
    db = MemoryDatabase(clock=lambda: T0 + timedelta(seconds=seconds[0]))
    clock, runner_id = ManualClock(), uuid.uuid4()
    db.session(lock_timeout_s=1).register(_registration(runner_id))
    beat, lease, drain = _phases(db, clock, runner_id)
    beat.run()
    assert lease.deadline == clock.now + 4.0 and beat.next_at == clock.now + 1.0 and not lease.fenced
    clock.now += 0.5
    beat.run()  # not due yet: nothing sent
    assert beat.db.statements == {"heartbeat": 1}
    db.session(lock_timeout_s=1).request_drain(runner_id, "test")
    clock.now += 0.6
    seconds[0] += 1.1
    beat.run()
    assert drain.draining and drain.reason == "drain requested in the registry"


def test_the_fence_phase_fences_once_the_margin_is_reached_and_a_beat_lifts_it():
    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    db.session(lock_timeout_s=1).register(_registration(runner_id))
    beat, lease, _ = _phases(db, clock, runner_id)
    beat.beat()
    clock.now += 4.0 - lease.timings.fence_margin - 0.01
    lease.run()
    assert not lease.fenced
    clock.now += 0.02
    lease.run()
    assert lease.fenced and lease.due() == []  # no live child: nothing to wake the loop for
    beat.beat()
    assert not lease.fenced and cast(float, lease.deadline) > clock.now
