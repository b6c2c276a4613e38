"""The simulated processes: a runner's host, its fork server (the launcher port), its children.

The supervisor gives the launcher real file descriptors (a socketpair's end, a pipe's write end), as
in production; a simulated child keeps duplicates of them and speaks the real protocol over them
(``runner.wire`` frames: ``started``, ``progress``, ``result``; it reads ``assign`` and ``cancel``), so
the supervisor's reading, its state machines and its finisher run unchanged. A child's work is virtual
time: its batches compute (CPU seconds grow), then commit through the in-memory ledger's batch fence.

Signals follow the kernel: SIGKILL ends a child at once, even a stopped one; SIGTERM and SIGUSR1 wait
for a stopped child's thaw; a child whose supervisor dies dies with it (PDEATHSIG, the parent watch);
the children of a dead fork server die with it. A stopped fork server answers no spawn and reports no
exit until it is thawed (decision 0112).
"""
from __future__ import annotations

import os
import signal
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner import wire
from runner.forkserver import ForkServerNotAnswering
from runner.launchers import ChildExit
from runner.memory_ledger import InMemoryLedger
from runner.simulation.world import WALL_EPOCH, Actor, World
from runner.timings import SPAWN_WAIT_DEFAULT
from scrinalia.domains.archive.ledger import is_batch_fence_refusal

if TYPE_CHECKING:
    from runner.simulation.faults import ChildPlan

SIM_LINK_FD = -1           # the fork server's link as the supervisor's wait sees it (the waiter ignores fds)
FORK_SECONDS = 0.003       # a fork of a preloaded server
CHILD_START_SECONDS = 0.005
RSS_BYTES = 64 << 20


@dataclass(eq=False)
class SimChild:
    """One child process: its run, its descriptors, its virtual CPU, what it is doing."""

    host: Host
    pid: int
    channel: socket.socket
    output_fd: int
    plan: ChildPlan
    run_id: uuid.UUID | None = None
    runner_id: uuid.UUID | None = None
    actor: Actor | None = None
    alive: bool = True
    exit: ChildExit | None = None
    cpu: float = 0.0
    computing_since: float | None = None
    pending_term: bool = False
    batch: Any = None                  # the open batch transaction, if any
    cancelled: bool = False
    committed: int = 0
    reader: wire.FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.channel.setblocking(False)  # the child reads what is there; the world never blocks on a socket
        self.reader = wire.FrameReader(self.channel)

    @property
    def world(self) -> World:
        return self.host.world

    @property
    def frozen(self) -> bool:
        actor = self.actor
        return actor is not None and actor.frozen_until is not None and actor.frozen_until > self.world.now

    def cpu_seconds(self) -> float:
        extra = 0.0
        if self.computing_since is not None and not self.frozen:
            extra = self.world.now - self.computing_since
        return self.cpu + extra

    # --- the child's own code -------------------------------------------------------------------------

    def main(self) -> None:
        world = self.world
        world.sleep(CHILD_START_SECONDS)
        assign = self._assignment()
        if assign is None:
            self.die(exit_code=76)  # the abandoned spawn of a stopped fork server: no assignment, it leaves
            return
        run = assign["run"]
        self.run_id, self.runner_id = run.run_id, run.runner_id
        self.host.sim.child_started(self)
        self.send("started", {"t": world.now, "stall_timeout": None})
        plan = self.plan
        for index in range(plan.batches):
            if self._cancel_requested():
                self.send("result", {"status": "CANCELLED", "result": {"batches": index}})
                self.die(exit_code=0)
                return
            if plan.crash_at == index:
                os.write(self.output_fd, b"Fatal Python error: Segmentation fault\n")
                self.die(signal_number=signal.SIGSEGV)
                return
            if plan.stall_at == index:
                world.sleep(1e9)  # silent, no CPU: the supervisor's stall rule ends it
                return
            self._compute(plan.compute * (plan.slow_factor if plan.slow_at == index else 1.0))
            if plan.long_call_at == index:
                self._compute(plan.long_call)  # one long C call: silent, yet CPU grows
            ending = self._commit(index)
            if ending is not None:
                self.send("result", ending)
                self.die(exit_code=0)
                return
            self.send("progress", {"done": index + 1, "total": plan.batches, "unit": "batch"})
        self.send("result", {"status": "SUCCESS", "result": {"batches": plan.batches}})
        self.die(exit_code=0)

    def _assignment(self) -> dict[str, Any] | None:
        for _ in range(50):
            try:
                messages = self.reader.read()
            except Exception:
                return None
            for kind, payload in messages:
                if kind == "assign":
                    return payload
            if self.reader.eof:
                return None
            self.world.sleep(0.002)
        return None

    def _cancel_requested(self) -> bool:
        try:
            for kind, _ in self.reader.read():
                if kind == "cancel":
                    self.cancelled = True
        except Exception:
            pass
        return self.cancelled

    def _compute(self, seconds: float) -> None:
        self.computing_since = self.world.now
        self.world.sleep(seconds)
        self.cpu += seconds
        self.computing_since = None

    def _commit(self, index: int) -> dict[str, Any] | None:
        """One batch through the fence (``RunContext.commit``): None when it committed."""
        assert self.run_id is not None and self.runner_id is not None
        for _attempt in range(3):
            batch = self.host.child_session.begin_batch(self.run_id, self.runner_id)
            self.batch = batch
            try:
                if not batch.register_fence():
                    batch.rollback()
                    return {"status": None, "lease_lost": True, "error": "LeaseLost: the lease was gone at the batch"}
                batch.write((self.pid, index))
                self.world.sleep(self.plan.write)  # the batch's writes, inside its transaction
                if self.plan.freeze_at == index:
                    self.world.freeze(self.actor, self.world.now + self.plan.freeze)  # type: ignore[arg-type]
                    self.world.sleep(0.0)  # a SIGSTOP between the batch's writes and its COMMIT
                batch.commit()
            except Exception as exc:
                batch.rollback()
                self.batch = None
                if is_batch_fence_refusal(exc):
                    return {"status": None, "lease_lost": True, "error": "LeaseLost: the fence refused the batch"}
                self.world.sleep(0.2)  # the SDK tries the batch again (the database did not answer)
                continue
            self.batch = None
            self.committed += 1
            self.host.sim.batch_committed(self, index)
            return None
        return {"status": "FAILED", "error": "OperationalError: the database did not take the batch"}

    def send(self, kind: str, payload: dict[str, Any]) -> None:
        try:
            self.channel.sendall(wire.encode(kind, payload))
        except OSError:
            return
        self.host.poke()

    # --- the kernel's side ----------------------------------------------------------------------------

    def signal(self, sig: int) -> None:
        if not self.alive:
            return
        if sig == signal.SIGKILL:
            self.die(signal_number=signal.SIGKILL)
        elif self.frozen:
            if sig == signal.SIGTERM:
                self.pending_term = True
                assert self.actor is not None and self.actor.frozen_until is not None
                self.world.at(self.actor.frozen_until, self._deliver_pending)
        elif sig == signal.SIGTERM:
            self.die(signal_number=signal.SIGTERM)
        elif sig == signal.SIGUSR1:
            os.write(self.output_fd, b"Thread 0x00007f0000000001 (most recent call first):\n  File \"w.py\", line 1\n")
            self.host.poke()

    def _deliver_pending(self) -> None:
        if self.pending_term and self.alive and not self.frozen:
            self.die(signal_number=signal.SIGTERM)

    def die(self, *, exit_code: int | None = None, signal_number: int | None = None) -> None:
        if not self.alive:
            return
        self.alive = False
        if self.batch is not None:
            self.batch.rollback()  # the connection closes: the transaction and its locks go with it
            self.batch = None
        if self.actor is not None and self.actor is not self.world.current:
            self.world.kill(self.actor)
        self.exit = ChildExit(self.pid, exit_code, signal_number, RSS_BYTES, round(self.cpu_seconds(), 3))
        self.channel.close()
        os.close(self.output_fd)
        self.host.poke()  # its channel's EOF
        self.host.sim.child_died(self)
        self.host.fork_server.reaped(self)


class SimForkServer:
    """The launcher port over a simulated fork server (``runner.forkserver.ForkServerLauncher``'s
    behaviour: a bounded spawn, a stalled state, exit reports, death and a background restart)."""

    name = "forkserver"
    child_preload: tuple[str, ...] = ()

    def __init__(self, host: Host) -> None:
        self.host = host
        self.warm_info: dict[str, Any] = {}  # the scale model keeps no weights
        self.pid = host.sim.new_pid()
        self.dead = False
        self.stopped_until: float | None = None
        self.ready_at: float | None = None     # a background start: ready then
        self.unanswered: set[int] = set()
        self.exits: list[ChildExit] = []
        self.token = 0
        self.children: dict[int, SimChild] = {}

    @property
    def world(self) -> World:
        return self.host.world

    @property
    def stopped(self) -> bool:
        return self.stopped_until is not None and self.stopped_until > self.world.now

    # --- the port ---------------------------------------------------------------------------------

    def start(self, wait: bool = True) -> None:
        self.pid = self.host.sim.new_pid()
        self.dead = False
        self.stopped_until = None
        self.unanswered = set()
        self.exits = []
        if wait:
            self.world.sleep(0.05)
            return
        self.ready_at = self.world.now + self.host.sim.rng.uniform(0.3, 2.0)  # preloading, off the loop
        self.world.at(self.ready_at, self.host.poke)

    @property
    def stalled(self) -> bool:
        return bool(self.unanswered) or self.starting

    @property
    def starting(self) -> bool:
        return self.ready_at is not None and self.ready_at > self.world.now

    def spawn(self, channel_fd: int, output_fd: int, timeout: float | None = None) -> int:
        if self.dead:
            raise ForkServerNotAnswering("the fork server is not running")
        if self.unanswered:
            raise ForkServerNotAnswering("the fork server has not answered an earlier spawn request (stalled)")
        self.token += 1
        token = self.token
        wait = SPAWN_WAIT_DEFAULT if timeout is None else max(0.0, timeout)
        fds = (os.dup(channel_fd), os.dup(output_fd))  # SCM_RIGHTS: the server holds them from the request on
        started = self.world.now
        if self.stopped:
            assert self.stopped_until is not None
            answer_at = self.stopped_until + FORK_SECONDS
            if answer_at - started > wait:
                self.world.sleep(wait)
                if self.dead:
                    _close(fds)
                    raise ForkServerNotAnswering("the fork server died during a spawn request")
                self.unanswered.add(token)
                self.world.at(answer_at, lambda: self._late_fork(token, fds))
                raise ForkServerNotAnswering(f"the fork server did not answer a spawn request within {wait:.3g} s")
            self.world.sleep(answer_at - started)
        else:
            self.world.sleep(FORK_SECONDS)
        if self.dead:
            _close(fds)
            raise ForkServerNotAnswering("the fork server died during a spawn request")
        return self._fork(fds).pid

    def _fork(self, fds: tuple[int, int]) -> SimChild:
        child = SimChild(self.host, self.host.sim.new_pid(), socket.socket(fileno=fds[0]), fds[1],
                         self.host.sim.faults.child_plan())
        self.children[child.pid] = child
        child.actor = self.world.spawn(f"{self.host.name}/child-{child.pid}", child.main)
        return child

    def _late_fork(self, token: int, fds: tuple[int, int]) -> None:
        """The stopped server's answer to a spawn the supervisor gave up on: that child finds its socket
        closed and exits at once; the answer clears ``stalled``."""
        if self.dead or self.stopped:
            if self.dead:
                _close(fds)
            else:
                assert self.stopped_until is not None
                self.world.at(self.stopped_until + FORK_SECONDS, lambda: self._late_fork(token, fds))
            return
        self._fork(fds)
        self.unanswered.discard(token)
        self.host.poke()

    def wait_fds(self) -> list[int]:
        return [] if self.dead else [SIM_LINK_FD]

    def collect_exits(self) -> list[ChildExit]:
        if self.stopped or self.dead:
            return []
        if self.ready_at is not None and self.ready_at <= self.world.now:
            self.ready_at = None
        exits, self.exits = self.exits, []
        return exits

    def healthy(self) -> bool:
        return not self.dead

    def info(self) -> dict[str, Any]:
        return {"start_method": "forkserver", "pid": self.pid, "preload": [], "preloaded": [],
                "preload_seconds": 0.0, "healthy": self.healthy(), "stalled": self.stalled,
                "starting": self.starting}

    def close(self) -> None:
        if not self.dead:
            self.die()

    def warm(self, key: dict[str, str], worker: str) -> bool:
        return False  # the scale model loads no model

    def set_prepare(self, prepare: dict[str, Any]) -> None:
        pass  # no standby child in the scale model

    # --- the world's side -------------------------------------------------------------------------

    def reaped(self, child: SimChild) -> None:
        self.children.pop(child.pid, None)
        if not self.dead and child.exit is not None:
            self.exits.append(child.exit)
            self.host.poke()

    def die(self) -> None:
        """The fork server is gone: its children die with it (PDEATHSIG); the supervisor sees its link's EOF."""
        self.dead = True
        self.ready_at = None
        for child in list(self.children.values()):
            child.signal(signal.SIGKILL)
        self.children.clear()
        self.host.poke()

    def stop(self, seconds: float) -> None:
        self.stopped_until = self.world.now + seconds
        self.world.at(self.stopped_until, self.host.poke)


def _close(fds: tuple[int, int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class SimProcesses:
    """The ``Processes`` port: signals and ``/proc`` of the simulated children of one host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def _child(self, pid: int) -> SimChild | None:
        return self.host.sim.children.get(pid)

    def signal_group(self, pid: int, sig: int) -> bool:
        child = self._child(pid)
        if child is None or not child.alive:
            return False
        child.signal(sig)
        return True

    def signal_one(self, pid: int, sig: int) -> bool:
        return self.signal_group(pid, sig)

    def cpu_seconds(self, pid: int) -> float | None:
        child = self._child(pid)
        return child.cpu_seconds() if child is not None and child.alive else None

    def rss_bytes(self, pid: int) -> int | None:
        child = self._child(pid)
        return RSS_BYTES if child is not None and child.alive else None

    def oom_kill_counter(self) -> int | None:
        return 0


class SimClock:
    """The ``Clock`` port of one host: CLOCK_MONOTONIC is the world's time; the wall clock may jump."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def monotonic(self) -> float:
        return self.host.world.now

    def wall(self) -> float:
        return WALL_EPOCH + self.host.world.now + self.host.wall_offset


class SimWaiter:
    """The ``Waiter`` port: the supervisor's select, as a wait on the world that a poke ends."""

    def __init__(self, world: World) -> None:
        self.world = world

    def wait(self, fds: Any, timeout: float) -> None:
        self.world.sleep(timeout, wakeable=True)


@dataclass(eq=False)
class Host:
    """One runner's machine: its supervisor (an actor), its fork server, its children, its clock."""

    sim: Any                       # runner.simulation.history.Simulation
    name: str
    world: World
    ledger: InMemoryLedger         # the supervisor's session
    child_session: InMemoryLedger  # the children's sessions (one behaviour: the child's bounds)
    wall_offset: float = 0.0
    actor: Actor | None = None
    supervisor: Any = None
    control: Any = None            # runner.simulation.control.SimControl
    killed: bool = False
    serving: bool = False          # inside ``Supervisor.serve``
    fork_server: SimForkServer = field(init=False)

    def __post_init__(self) -> None:
        self.fork_server = SimForkServer(self)

    @property
    def stopped(self) -> bool:
        actor = self.actor
        return actor is not None and actor.frozen_until is not None and actor.frozen_until > self.world.now

    @property
    def thawed_at(self) -> float | None:
        return self.actor.thawed_at if self.actor is not None else None

    @property
    def running(self) -> bool:
        return self.actor is not None and not self.killed and not self.actor.finished

    def poke(self) -> None:
        if self.actor is not None and not self.killed:
            self.actor.poke()

    def kill(self) -> None:
        """SIGKILL of the supervisor: its fork server dies (PDEATHSIG), and the children with it."""
        self.killed = True
        if self.actor is not None:
            self.world.kill(self.actor)
        self.fork_server.die()
        for child in list(self.sim.children.values()):
            if child.host is self and child.alive:
                child.signal(signal.SIGKILL)
