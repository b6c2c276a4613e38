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
from runner.loop_state import Requests
from runner.memory_ledger import MemoryDatabase
from runner.options import RunnerOptions
from runner.ports import SystemProcesses
from runner.tending import Conversation, Effects, Sampler
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
    effects = Effects(clock, children, SystemProcesses(), finisher, timings, Conversation(clock, timings, None),
                      Requests())
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


def test_the_loop_runs_its_phases_in_the_written_order_and_each_follows_what_it_names():
    """``PHASE_ORDER`` is the one place the order is written; a phase moved before one it must follow
    (the poll before the heartbeat, the exits before the children's messages) fails here."""
    from types import SimpleNamespace

    from runner.launchers import SpawnLauncher
    from runner.loop_state import PHASE_ORDER
    from runner.supervisor import Supervisor

    names = [position.name for position in PHASE_ORDER]
    assert len(set(names)) == len(names)
    for index, position in enumerate(PHASE_ORDER):
        assert position.why, position.name
        for earlier in position.after:
            assert earlier in names[:index], f"{position.name} must follow {earlier}"
    sup = Supervisor(RunnerOptions(name="x").validate(), engine=None, database_url="", child_connect_args={},
                     launcher=SpawnLauncher(), install_signals=False,
                     registration=cast(Any, SimpleNamespace(runner_id=uuid.uuid4(), capabilities=(), name="x")))
    assert [phase.name for phase in sup.phases] == names


def test_a_run_s_end_asks_for_a_claim_and_an_abandoned_one_for_a_beat_through_requests():
    """Effects never calls the poll or the heartbeat: it writes requests, which the loop hands over."""
    import socket
    import subprocess
    from types import SimpleNamespace

    from runner.children import Child
    from runner.launchers import ChildExit

    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0).validate().timings
    link = LedgerLink(db.session(lock_timeout_s=timings.server_statement_seconds))
    children: dict[int, Any] = {}
    finisher = Finisher(clock, link, runner_id, timings, "spawn", SystemProcesses())
    requests = Requests()
    effects = Effects(clock, children, SystemProcesses(), finisher, timings, Conversation(clock, timings, None),
                      requests)
    a, b = socket.socketpair()
    b.close()  # the channel is over: its EOF is read at the end
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a real child, its own group
    run = cast(Any, SimpleNamespace(run_id=uuid.uuid4(), worker_name="w"))
    child = Child(run=run, pid=process.pid, channel=a, output_fd=None, claimed_at=clock.now)
    children[child.pid] = child
    effects.apply(child, child.state.fence(clock.now))  # SIGKILLed by the self-fence
    assert process.wait(timeout=10) == -9 and not requests.pending()
    effects.apply(child, child.state.exited(ChildExit(process.pid, None, 9, None, None), clock.now))
    effects.apply(child, child.state.closed())
    assert child.pid not in children and requests.claim and requests.beat and requests.held is None
    assert run.run_id in finisher.abandoned
