"""Each phase of the supervisor alone, on the in-memory ledger and a clock the test moves (decision 0130):
no process, no database server, no loop."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from runner.drain import Drain
from runner.finisher import Finisher
from runner.lease import Fence, Heartbeat, HeartbeatConfig, Lease
from runner.ledger_link import LedgerLink
from runner.loop_state import ChildSetup, Requests
from runner.memory_ledger import MemoryDatabase
from runner.options import RunnerOptions
from runner.ports import Host, SystemProcesses
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


def _phases(db: MemoryDatabase, clock: ManualClock, runner_id: uuid.UUID) -> tuple[Heartbeat, Fence, Drain]:
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0).validate().timings
    children: dict[int, Any] = {}
    requests = Requests()
    lease = Lease(clock, timings, children)
    link = LedgerLink(db.session(lock_timeout_s=timings.server_statement_seconds), lease, requests)
    finisher = Finisher(clock, link, runner_id, timings, "spawn", SystemProcesses())
    drain = Drain(clock, timings.drain_timeout, None, lambda: 0)
    effects = Effects(clock, children, SystemProcesses(), finisher, timings, Conversation(clock, timings, None),
                      requests)
    beat = Heartbeat(clock, HeartbeatConfig(runner_id, timings), link, lease, children, effects, drain,
                     Sampler(children, SystemProcesses(), None))
    return beat, Fence(lease, children, effects), drain


def test_the_heartbeat_renews_the_lease_on_the_database_clock_and_hands_over_a_drain_request():
    seconds = [0.0]
    db = MemoryDatabase(clock=lambda: T0 + timedelta(seconds=seconds[0]))
    clock, runner_id = ManualClock(), uuid.uuid4()
    db.session(lock_timeout_s=1).register(_registration(runner_id))
    beat, fence, drain = _phases(db, clock, runner_id)
    lease = fence.lease
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
    beat, fence, _ = _phases(db, clock, runner_id)
    lease = fence.lease
    beat.beat()
    clock.now += 4.0 - lease.timings.fence_margin - 0.01
    fence.run()
    assert not lease.fenced
    clock.now += 0.02
    fence.run()
    assert lease.fenced and fence.due() == []  # no live child: nothing to wake the loop for
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
    sup = Supervisor(RunnerOptions(name="x").validate(),
                     cast(Any, SimpleNamespace(runner_id=uuid.uuid4(), capabilities=(), name="x")), SpawnLauncher(),
                     ChildSetup("", {}), host=Host(install_signals=False))
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


# --- the small phases, each from its own collaborators ---------------------------------------------------


def test_the_watchdog_phase_pings_systemd_at_half_its_timeout(tmp_path):
    """A real notify socket (what systemd reads): WATCHDOG=1 at start, then once per interval, never between."""
    import socket

    from runner.sdnotify import Notifier
    from runner.supervisor import Watchdog

    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(path)
        systemd.setblocking(False)
        clock = ManualClock()
        watchdog = Watchdog(clock, Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}))

        def pings() -> list[bytes]:
            got = []
            while True:
                try:
                    got.append(systemd.recv(256))
                except BlockingIOError:
                    return got

        watchdog.run()
        assert pings() == [b"WATCHDOG=1"] and watchdog.due() == [clock.now + 1.0]
        clock.now += 0.9
        watchdog.run()
        assert pings() == []
        clock.now += 0.2
        watchdog.run()
        assert pings() == [b"WATCHDOG=1"]
    assert Watchdog(clock, Notifier({})).due() == []  # not under systemd: never due


def test_the_title_phase_sets_the_process_title_only_when_the_status_changes():
    from runner.supervisor import Title

    status, titles = ["running: 0/1 busy"], list[str]()
    title = Title("gpu-a", lambda: status[0], titles.append)
    title.run()
    title.run()
    status[0] = "draining: 1/1 busy"
    title.run()
    assert titles == ["scrinalia-runner: supervisor gpu-a [running: 0/1 busy]",
                      "scrinalia-runner: supervisor gpu-a [draining: 1/1 busy]"]
    assert title.due() == []


def test_the_control_phase_answers_a_waiting_client_on_a_real_socket(tmp_path):
    import threading

    from runner.control import ControlServer, query
    from runner.supervisor import ControlPhase

    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    db.session(lock_timeout_s=1).register(_registration(runner_id))
    _, fence, _ = _phases(db, clock, runner_id)
    lease = fence.lease
    server = ControlServer(tmp_path / "control.sock")
    server.open()
    asked: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    try:
        def answer(request: dict[str, Any]) -> dict[str, Any]:
            asked.append(request)
            return {"state": "running"}

        phase = ControlPhase(server, answer, lease)
        client = threading.Thread(target=lambda: answers.append(query(server.path, {"command": "status"})))
        client.start()
        while client.is_alive():
            phase.run()
            client.join(0.01)
    finally:
        server.close()
    assert asked == [{"command": "status"}] and answers == [{"state": "running"}]


class Announcements:
    """The wakeup port as the LISTEN connection fills it: what was announced since the last read."""

    def __init__(self) -> None:
        self.claim = False
        self.cancelled: set[uuid.UUID] = set()

    def read(self, now: float) -> Any:
        from types import SimpleNamespace

        news = SimpleNamespace(claim=self.claim, cancelled=set(self.cancelled))
        self.claim, self.cancelled = False, set()
        return news

    def due_at(self) -> float:
        return 1e9


def test_the_wakeup_phase_turns_announcements_into_requests_and_calls_no_phase():
    from runner.lease import Notifications

    clock, requests, port = ManualClock(), Requests(), Announcements()
    phase = Notifications(clock, port, {}, requests)
    phase.run()
    assert not requests.pending()
    port.claim = True
    phase.run()
    assert requests.claim and not requests.beat
    requests.claim = False
    port.cancelled = {uuid.uuid4()}  # a cancel for a run this runner does not hold: nothing to beat for
    phase.run()
    assert not requests.pending() and phase.due() == [1e9]


def test_the_progress_phase_writes_changed_progress_once_per_interval():
    from types import SimpleNamespace

    from runner.lease import ProgressWriter
    from runner.timings import PROGRESS_INTERVAL

    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    session = db.session(lock_timeout_s=1)
    session.register(_registration(runner_id))
    session.enqueue("w", {})
    run = session.claim_next(runner_id, ["w"], 4.0)
    assert run is not None
    link = LedgerLink(db.session(lock_timeout_s=1))
    state = SimpleNamespace(alive=True)
    child = SimpleNamespace(run=run, progress={"done": 1, "total": 4}, progress_written=None, state=state)
    phase = ProgressWriter(clock, link, runner_id, {1: cast(Any, child)})
    assert phase.due() == [0.0]
    phase.run()
    assert link.statements == {"record_progress": 1} and child.progress_written == {"done": 1, "total": 4}
    assert phase.due() == []  # nothing new to write
    child.progress = {"done": 2, "total": 4}
    phase.run()  # changed, but within the interval: not yet
    assert link.statements == {"record_progress": 1}
    clock.now += PROGRESS_INTERVAL
    phase.run()
    assert link.statements == {"record_progress": 2}
    assert db.session(lock_timeout_s=1).get_run(run.run_id).progress == {"done": 2, "total": 4}


def _effects(clock: ManualClock, children: dict[int, Any]) -> tuple[Effects, Drain]:
    db = MemoryDatabase(clock=lambda: T0)
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0, max_runtime=5.0,
                            kill_grace=2.0).validate().timings
    link = LedgerLink(db.session(lock_timeout_s=1))
    finisher = Finisher(clock, link, uuid.uuid4(), timings, "spawn", SystemProcesses())
    effects = Effects(clock, children, SystemProcesses(), finisher, timings, Conversation(clock, timings, None),
                      Requests())
    return effects, Drain(clock, timings.drain_timeout, None, lambda: len(children))


def test_the_children_phase_reads_what_a_child_says_over_its_channel():
    import socket
    from types import SimpleNamespace

    from runner import wire
    from runner.children import Child
    from runner.run_state import RunPhase
    from runner.tending import ChildMessages

    clock, children = ManualClock(), dict[int, Any]()
    effects, _ = _effects(clock, children)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)  # as the supervisor keeps it: the loop never waits on one child
    child = Child(run=cast(Any, SimpleNamespace(run_id=uuid.uuid4(), worker_name="w")), pid=1, channel=ours,
                  output_fd=None, claimed_at=clock.now)
    children[child.pid] = child
    phase = ChildMessages(children, effects)
    wire.send(theirs, "started", {"t": clock.now})
    wire.send(theirs, "progress", {"done": 3, "total": 10})
    phase.run()
    assert child.state.phase is RunPhase.RUNNING and child.progress == {"done": 3, "total": 10}
    wire.send(theirs, "result", {"status": "SUCCESS"})
    theirs.close()
    phase.run()
    assert child.state.phase is RunPhase.FINISHING and child.state.channel_closed and child.pid in children
    ours.close()


def test_the_deadlines_phase_kills_a_run_past_its_max_runtime():
    """A real process in its own group, deaf to SIGTERM: SIGKILLed once --max-runtime has passed."""
    import signal
    import socket
    import subprocess
    from types import SimpleNamespace

    from runner.children import Child
    from runner.tending import Deadlines

    clock, children = ManualClock(), dict[int, Any]()
    effects, drain = _effects(clock, children)
    process = subprocess.Popen(["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                               start_new_session=True, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"  # SIGTERM is ignored from now
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    child = Child(run=cast(Any, SimpleNamespace(run_id=uuid.uuid4(), worker_name="w")), pid=process.pid,
                  channel=ours, output_fd=None, claimed_at=clock.now)
    child.state.started(clock.now)
    children[child.pid] = child
    phase = Deadlines(clock, children, effects, SystemProcesses(), effects.timings, drain)
    assert min(phase.due()) == clock.now + 5.0
    clock.now += 4.9
    phase.run()
    assert process.poll() is None
    clock.now += 0.1
    phase.run()
    assert process.wait(timeout=10) == -signal.SIGKILL and child.state.kill_reason == "timeout"
    assert phase.due() == []  # killed: only its exit is awaited
    ours.close()
    theirs.close()


class RefuseOnce:
    """A session's statement hook (the simulator's): the first ``finish`` never reaches the server."""

    def __init__(self) -> None:
        self.refused = 0

    def before(self, session: Any, what: str) -> None:
        from runner.memory_ledger import unreachable_error

        if what == "finish" and not self.refused:
            self.refused += 1
            raise unreachable_error(what)

    def after(self, session: Any, what: str) -> None:
        return None


def test_the_finishes_phase_writes_a_finish_the_database_did_not_take_once_it_answers_again():
    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0).validate().timings
    setup = db.session(lock_timeout_s=1)
    setup.register(_registration(runner_id))
    setup.enqueue("w", {})
    run = setup.claim_next(runner_id, ["w"], 4.0)
    assert run is not None
    faults = RefuseOnce()
    link = LedgerLink(db.session(lock_timeout_s=1, faults=faults))
    finisher = Finisher(clock, link, runner_id, timings, "spawn", SystemProcesses())
    finisher.start_failed(run, OSError("no fork"))
    assert faults.refused == 1 and len(finisher.pending) == 1 and finisher.due() == []  # the database is down
    link.call("heartbeat", link.ledger.heartbeat, runner_id, 4.0, progress={}, children=None)  # it answers
    assert finisher.due() == [clock.now]
    finisher.run()
    assert finisher.pending == [] and finisher.settled
    final = db.session(lock_timeout_s=1).get_run(run.run_id)
    assert final.status == "FAILED" and final.exit_reason == "exception"


def test_the_signals_phase_begins_a_drain_on_sigterm_and_stops_at_once_on_a_second():
    import os
    import signal

    from runner.signals import SignalPipe
    from runner.supervisor import SignalPhase

    clock, children = ManualClock(), dict[int, Any]()
    effects, drain = _effects(clock, children)
    pipe = SignalPipe()
    pipe.install()
    try:
        phase = SignalPhase(pipe, drain)
        os.kill(os.getpid(), signal.SIGTERM)  # waits in the self-pipe for the phase
        assert not drain.draining
        phase.run()
        assert drain.draining and drain.reason == "SIGTERM received" and drain.deadline == clock.now + 120
        os.kill(os.getpid(), signal.SIGTERM)
        phase.run()
        assert drain.deadline == clock.now  # a second TERM while draining: stop now
    finally:
        pipe.restore()


# --- the fence is a phase: a statement only checks the bound (decision 0312) ---------------------------


def _live_child(children: dict[int, Any], clock: ManualClock) -> Any:
    """A real process in its own group, in the table as a running child."""
    import socket
    import subprocess
    from types import SimpleNamespace

    from runner.children import Child

    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ours, theirs = socket.socketpair()
    theirs.close()
    child = Child(run=cast(Any, SimpleNamespace(run_id=uuid.uuid4(), worker_name="w")), pid=process.pid,
                  channel=ours, output_fd=None, claimed_at=clock.now)
    child.state.started(clock.now)
    children[child.pid] = child
    return process


def test_a_statement_past_the_fence_point_is_refused_and_asks_for_the_fence_which_only_the_loop_runs():
    """No statement starts past the fence point with a live child; the link does not kill it itself (it may
    be deep inside another phase): it writes the request, and the fence phase runs when the loop hands it
    over, between two phases."""
    from runner.ledger_link import DatabaseDown

    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    db.session(lock_timeout_s=1).register(_registration(runner_id))
    beat, fence, _ = _phases(db, clock, runner_id)
    lease, link, requests = fence.lease, beat.db, beat.effects.requests
    beat.beat()
    process = _live_child(fence.children, clock)
    try:
        point = lease.fence_point()
        assert point is not None and fence.due() == [point]
        clock.now = point - 0.01
        link.call("heartbeat", link.ledger.heartbeat, runner_id, 4.0, progress={}, children=None)
        assert not requests.fence and link.refused == {}
        clock.now = point
        try:
            link.call("record_progress", link.ledger.record_progress, runner_id, {})
            raise AssertionError("a statement past the fence point was sent")
        except DatabaseDown:
            pass
        assert link.refused == {"record_progress": 1} and link.statements == {"heartbeat": 2}
        assert requests.fence and not lease.fenced and process.poll() is None  # nobody was killed from inside
        fence.run()  # the loop's turn
        assert lease.fenced and process.wait(timeout=10) == -9
    finally:
        if process.poll() is None:
            process.kill()


def test_the_loop_hands_a_fence_request_to_the_fence_phase_before_the_next_phase():
    from types import SimpleNamespace

    from runner.launchers import SpawnLauncher
    from runner.supervisor import Supervisor

    clock = ManualClock()
    sup = Supervisor(RunnerOptions(name="x", heartbeat_seconds=1.0, lease_seconds=4.0).validate(),
                     cast(Any, SimpleNamespace(runner_id=uuid.uuid4(), capabilities=("w",), name="x")),
                     SpawnLauncher(), ChildSetup("", {}),
                     ledger=MemoryDatabase(clock=lambda: T0).session(lock_timeout_s=1),
                     host=Host(clock=clock, install_signals=False))
    sup.lease.deadline = clock.now + sup.timings.fence_margin  # the margin is spent
    assert not sup.lease.fenced and sup.lease.within_margin() and not sup.poll.may_claim()
    sup.requests.fence = True
    sup._hand_over(sup.requests)
    assert sup.lease.fenced and not sup.requests.pending()


# --- the one-shot's own phase list -------------------------------------------------------------------------


def test_the_one_shot_runs_its_own_phase_list_written_once_with_its_reasons():
    """``ONESHOT_ORDER`` is the CLI's loop: no claims, no LISTEN, no control socket, no systemd, and a
    Ctrl-C that cancels instead of draining. A phase moved before one it must follow, or a daemon's phase
    slipped in, fails here."""
    from types import SimpleNamespace

    from runner.launchers import SpawnLauncher
    from runner.loop_state import ONESHOT, ONESHOT_ORDER, PHASE_ORDER
    from runner.supervisor import Interrupts, Supervisor

    names = [position.name for position in ONESHOT_ORDER]
    assert len(set(names)) == len(names)
    for index, position in enumerate(ONESHOT_ORDER):
        assert position.why, position.name
        for earlier in position.after:
            assert earlier in names[:index], f"{position.name} must follow {earlier}"
    daemon = [position.name for position in PHASE_ORDER]
    assert set(daemon) - set(names) == {"signals", "wakeup", "control", "poll", "watchdog"}
    assert set(names) - set(daemon) == {"interrupts"}
    assert [n for n in daemon if n in names] == [n for n in names if n in daemon]  # the shared ones keep their order
    sup = Supervisor(RunnerOptions(name="x").validate(),
                     cast(Any, SimpleNamespace(runner_id=uuid.uuid4(), capabilities=(), name="x")), SpawnLauncher(),
                     ChildSetup("", {}), host=Host(install_signals=False), loop=ONESHOT)
    assert [phase.name for phase in sup.phases] == names and isinstance(sup.phases[0], Interrupts)
    assert not ONESHOT.until_drained


# --- exits and poll, each alone --------------------------------------------------------------------------


class Reaper:
    """A launcher over real processes the test started: their exit reports, and the models asked warm."""

    name = "spawn"
    stalled = False
    child_preload: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.processes: dict[int, Any] = {}
        self.asked: list[tuple[dict[str, str], str]] = []

    def collect_exits(self) -> list[Any]:
        import os

        from runner.launchers import ChildExit

        exits = []
        for pid in list(self.processes):
            got, status, rusage = os.wait4(pid, os.WNOHANG)
            if got:
                del self.processes[pid]
                exits.append(ChildExit.from_wait(pid, status, rusage))
        return exits

    def healthy(self) -> bool:
        return True

    def warm(self, key: dict[str, str], worker: str) -> bool:
        self.asked.append((key, worker))
        return True


def test_the_exits_phase_ends_a_run_whose_exit_and_channel_end_were_seen_and_asks_a_cold_model_warm():
    """A real child process sends its result over a real channel and exits: the exits phase reads what it
    sent first, hands the run to the finisher (the row is SUCCESS in the ledger), asks the launcher to keep
    the model it loaded cold warm, and frees the slot (a claim request, not a call to the poll)."""
    import socket
    import subprocess

    from runner import wire
    from runner.children import Child
    from runner.tending import Exits

    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    setup = db.session(lock_timeout_s=1)
    setup.register(_registration(runner_id))
    setup.enqueue("w", {})
    run = setup.claim_next(runner_id, ["w"], 4.0)
    assert run is not None
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0).validate().timings
    children: dict[int, Any] = {}
    requests = Requests()
    finisher = Finisher(clock, LedgerLink(db.session(lock_timeout_s=1)), runner_id, timings, "spawn",
                        SystemProcesses())
    effects = Effects(clock, children, SystemProcesses(), finisher, timings, Conversation(clock, timings, None),
                      requests)
    launcher = Reaper()
    phase = Exits(clock, children, cast(Any, launcher), effects, Drain(clock, 1.0, None, lambda: len(children)))
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    process = subprocess.Popen(["sleep", "0"], start_new_session=True)
    launcher.processes[process.pid] = process
    child = Child(run=run, pid=process.pid, channel=ours, output_fd=None, claimed_at=clock.now)
    children[child.pid] = child
    load = {"warm": False, "seconds": 2.5, "model_class": "M", "model_dir": "/models/m", "dtype": "float32"}
    wire.send(theirs, "started", {"t": clock.now})
    wire.send(theirs, "result", {"status": "SUCCESS", "metrics": {"model_loads": [load]}})
    theirs.close()
    import os

    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # it exited; its report is the phase's to reap
    phase.run()
    assert child.pid not in children and requests.claim and not requests.beat
    assert launcher.asked == [({"model_class": "M", "model_dir": "/models/m", "dtype": "float32"}, "w")]
    final = db.session(lock_timeout_s=1).get_run(run.run_id)
    assert final.status == "SUCCESS" and final.metrics["model_load"] == [{"warm": False, "seconds": 2.5}]
    assert phase.due() == []


class Spec:
    """A catalogue entry that resolves without the database (its own resolver)."""

    resolver = "own"
    engine_source = "test"

    def resolve(self, engine: Any, request: dict[str, Any], layer: Any = None) -> Any:
        from scrinalia.domains.archive.workers.sdk import ResolvedConfig

        return ResolvedConfig(engine_name="test", preset=None, db_batch_size=16, options={}, engine_options={},
                              config={}, sources={})


class NotReady(Reaper):
    """A launcher that starts nothing (a stopped fork server): each claimed run waits for it."""

    def spawn(self, channel_fd: int, output_fd: int, timeout: float | None = None) -> int:
        from runner.launchers import LauncherNotReady

        raise LauncherNotReady("stopped")

    def set_prepare(self, prepare: dict[str, Any]) -> None:
        raise AssertionError("no child was started")


def test_the_poll_phase_expires_leases_and_claims_one_run_per_free_slot_on_its_cadence():
    from runner.claims import Poll, PollConfig, Starts, StartsConfig

    seconds = [0.0]
    db = MemoryDatabase(clock=lambda: T0 + timedelta(seconds=seconds[0]))
    clock, runner_id, other = ManualClock(), uuid.uuid4(), uuid.uuid4()
    setup = db.session(lock_timeout_s=1)
    setup.register(_registration(runner_id))
    setup.register(_registration(other))
    setup.enqueue("a", {})
    stale = setup.claim_next(other, ["a"], 1.0)  # another runner's claim, whose lease will pass
    assert stale is not None
    for worker in ("b", "c", "d"):  # one active run per worker
        setup.enqueue(worker, {})
    seconds[0] = 2.0
    timings = RunnerOptions(name="t", heartbeat_seconds=1.0, lease_seconds=4.0, concurrency=2).validate().timings
    children: dict[int, Any] = {}
    lease = Lease(clock, timings, children)
    link = LedgerLink(db.session(lock_timeout_s=1), lease)
    finisher = Finisher(clock, link, runner_id, timings, "spawn", SystemProcesses())
    drain = Drain(clock, timings.drain_timeout, None, lambda: len(children))
    config = StartsConfig(runner_id, timings, ChildSetup("", {}, dict.fromkeys("abcd", Spec())))
    starts = Starts(Host(clock=clock), config, link, cast(Any, NotReady()), finisher, children, lease, drain)
    poll = Poll(clock, PollConfig(runner_id, ["a", "b", "c", "d"], 2, timings), link, starts, lease, drain, None,
                Sampler(children, SystemProcesses(), None))
    link.call("heartbeat", link.ledger.heartbeat, runner_id, 4.0, progress={}, children=None)  # the link answers
    assert poll.due() == [0.0] and poll.may_claim()
    poll.run()
    assert link.statements["expire_leases"] == 1 and link.statements["claim"] == 2  # two slots: two claims
    assert starts.count == 2 and len(starts.waiting) == 2 and not poll.may_claim()  # both wait for the launcher
    assert db.session(lock_timeout_s=1).get_run(stale.run_id).status == "INTERRUPTED"
    assert finisher.counters["claimed"] == 2 and poll.next_at == clock.now + poll.interval()
    poll.run()  # not due again yet: nothing sent
    assert link.statements["claim"] == 2
    drain.begin("test")
    assert poll.due() == [] and not poll.may_claim()


def test_the_interrupts_phase_cancels_the_one_shot_run_on_ctrl_c_and_kills_it_on_a_second():
    """The one-shot's ``interrupts``: a first SIGINT writes the cancel request and tells the child; a
    second one SIGKILLs it (a real child process in its own group). No drain either time."""
    import os
    import signal

    from runner.signals import SignalPipe
    from runner.supervisor import Interrupts

    db = MemoryDatabase(clock=lambda: T0)
    clock, runner_id = ManualClock(), uuid.uuid4()
    setup = db.session(lock_timeout_s=1)
    setup.register(_registration(runner_id))
    setup.enqueue("w", {})
    run = setup.claim_next(runner_id, ["w"], 4.0)
    assert run is not None
    children = dict[int, Any]()
    effects, drain = _effects(clock, children)
    process = _live_child(children, clock)
    child = next(iter(children.values()))
    child.run = run
    link = LedgerLink(db.session(lock_timeout_s=1))
    pipe = SignalPipe()
    pipe.install()
    try:
        phase = Interrupts(pipe, drain, children, effects, link, "operator")
        os.kill(os.getpid(), signal.SIGINT)
        phase.run()
        assert link.statements == {"request_cancel": 1} and child.state.cancel_sent_at == clock.now
        assert db.session(lock_timeout_s=1).get_run(run.run_id).cancel_requested_at is not None
        assert process.poll() is None and not drain.draining
        os.kill(os.getpid(), signal.SIGINT)
        phase.run()
        assert process.wait(timeout=10) == -signal.SIGKILL and not drain.draining
        assert phase.due() == []
    finally:
        pipe.restore()
        if process.poll() is None:
            process.kill()
