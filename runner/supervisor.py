"""The supervisor: one loop over an explicit list of phases and a table of children (the arbiter).

Shaped like gunicorn's arbiter, with each phase an object that owns its state and receives its
collaborators explicitly (River's maintenance services; decision 0130). One thread does everything.
Each time the wait wakes it (a signal through the self-pipe, a child's message, an exit report, a
control request, or a timer), it runs ``Supervisor.phases``, in the order of its loop's list
(``loop_state.PHASE_ORDER`` for the daemon, ``loop_state.ONESHOT_ORDER`` for the one-shot CLI):

    signals    TERM/INT: drain (a second one: stop now); the one-shot's ``interrupts``: INT = cancel, again = kill
    wakeup     a notification: claim now, or beat now for a cancel request      (lease.Notifications)
    fence      the lease could not be renewed in time: SIGKILL every child, claim nothing (lease.Fence)
    children   their messages: started (ready time), progress, result; the channel's EOF
    exits      exit reports; a run whose exit AND channel's end were observed goes to the finisher
    control    ``scrinalia-runner status`` over the unix socket
    heartbeat  ONE statement per interval: the registry row + every RUNNING row of this runner
    unstarted  claimed runs waiting for the database or the launcher: resolve, ``record_start``, child
    finishes   the finisher's writes that the database did not take, retried (finisher.Finisher)
    progress   ONE statement for the progress of every child that changed
    deadlines  --max-runtime, the cancel grace, the drain timeout, SIGTERM -> SIGKILL escalation
    poll       ``expire_leases`` on its own cadence (every lease/4); claim while a slot is free
    watchdog   systemd's watchdog
    title      the process title

A phase never calls another: what it wants of one (claim now, beat now, fence now) is a request
(``loop_state.Requests``) that the loop hands over between two phases (decisions 0311, 0312).
The loop sleeps until the earliest moment any phase is ``due`` (at most ``MAX_SELECT_WAIT``). Time,
the wait, signals to children, the launcher, the control socket and the ledger are ports
(``runner.ports``, ``runner.ledger_port``): production adapters by default, virtual ones in the
deterministic simulator (``runner.simulation``), which runs this very class.

Each run in the table has a state machine (``runner.run_state``): the phases feed it events and carry
out the effects it returns. ONE finisher (``runner.finisher``) decides and writes every terminal outcome.
No thread writes to the ledger, no callback runs from a signal handler (``runner.signals``). A database
error never kills the loop: the statement is retried later, and if the lease cannot be renewed before
``lease - fence_margin`` the children are killed before another runner may expire their rows.
See docs/architecture.md.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from typing import Any, cast

from runner.children import Child
from runner.claims import ConfigurationError, Poll, PollConfig, Starts, StartsConfig
from runner.drain import Drain
from runner.finisher import Finisher
from runner.launchers import Launcher, signal_name
from runner.lease import Fence, Heartbeat, HeartbeatConfig, Lease, Notifications, ProgressWriter
from runner.ledger_link import DatabaseDown, LedgerLink, brief
from runner.ledger_port import LedgerPort
from runner.loop_state import DAEMON, ChildSetup, Loop, Phase, Requests, Services, Uptime
from runner.options import RunnerOptions
from runner.outcome import OPERATOR_INTERRUPT
from runner.ports import Clock, ControlPort, Host
from runner.signals import SignalPipe
from runner.tending import ChildMessages, Conversation, Deadlines, Effects, Exits, Sampler
from runner.timings import MAX_SELECT_WAIT, NO_PIDFD_POLL, Timings
from scrinalia.domains.archive import registry
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.workers.sdk import ResolvedConfig
from scrinalia.journal import set_process_fields

log = logging.getLogger("scrinalia.runner")

_brief = brief  # the CLI's name for it
__all__ = ["Child", "ConfigurationError", "DatabaseDown", "Supervisor", "_brief"]


class Supervisor:
    """The parent of the runner's children. ``loop`` is ``DAEMON`` (claims from the queue) or ``ONESHOT``
    (the CLI's one run): each its own phase list (``runner.loop_state``)."""

    def __init__(
        self,
        options: RunnerOptions,
        registration: registry.RunnerRegistration,
        launcher: Launcher,
        setup: ChildSetup,
        *,
        services: Services | None = None,
        ledger: LedgerPort | None = None,
        host: Host | None = None,
        loop: Loop = DAEMON,
    ) -> None:
        if ledger is None:
            from runner.pg_ledger import PostgresLedger

            ledger = PostgresLedger(setup.engine)  # type: ignore[arg-type]  # None: a supervisor that sends nothing
        self.options = options
        self.loop = loop
        self.launcher = launcher
        self.registration = registration
        self.host = host or Host()
        self.services = services or Services()
        self.uptime = Uptime(self.clock.wall(), self.clock.monotonic())
        self.signals = SignalPipe()
        self._registered = False
        self.children: dict[int, Child] = {}
        self._build(ledger, setup)

    def _build(self, ledger: LedgerPort, setup: ChildSetup) -> None:
        """The phases, each given its own config and collaborators; then the loop's phase list, in its order.
        Nothing is patched in after construction: what a phase wants of another is a request (decision 0311)."""
        host, clock, timings, children, runner_id = self.host, self.clock, self.timings, self.children, self.runner_id
        services = self.services
        self.requests = Requests()
        lease = Lease(clock, timings, children)
        self.db = LedgerLink(ledger, lease, self.requests)  # no statement starts or outlives the fence point
        self.finisher = Finisher(clock, self.db, runner_id, timings, self.launcher.name, host.processes)
        self.drain = Drain(clock, timings.drain_timeout, services.notifier, lambda: len(children))
        conversation = Conversation(clock, timings, services.on_progress)
        effects = Effects(clock, children, host.processes, self.finisher, timings, conversation, self.requests)
        sampler = Sampler(children, host.processes, services.gpu)
        self.fence = Fence(lease, children, effects)
        beat = HeartbeatConfig(runner_id, timings, warm=lambda: self.launcher.warm_info)  # decision 0381
        self.heartbeat = Heartbeat(clock, beat, self.db, lease, children, effects, self.drain, sampler)
        self.starts = Starts(host, StartsConfig(runner_id, timings, setup, services.devices), self.db,
                             self.launcher, self.finisher, children, lease, self.drain)
        self.poll = Poll(clock, PollConfig(runner_id, self.capabilities, self.options.concurrency, timings,
                                           services.devices),
                         self.db, self.starts, lease, self.drain, services.wakeup, sampler)
        built: tuple[Phase, ...] = (
            SignalPhase(self.signals, self.drain),
            Interrupts(self.signals, self.drain, children, effects, self.db, self.registration.name),
            Notifications(clock, services.wakeup, children, self.requests),
            self.fence, ChildMessages(children, effects), Exits(clock, children, self.launcher, effects, self.drain),
            ControlPhase(services.control, self.answer, lease),
            self.heartbeat, self.starts, self.finisher, ProgressWriter(clock, self.db, runner_id, children),
            Deadlines(clock, children, effects, host.processes, timings, self.drain), self.poll,
            Watchdog(clock, services.notifier), Title(self.registration.name, self.status_line, host.set_title),
        )
        by_name = {phase.name: phase for phase in built}
        self.phases: tuple[Phase, ...] = tuple(by_name[position.name] for position in self.loop.order)

    # --- what the phases share, by name --------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        return self.host.clock

    @property
    def timings(self) -> Timings:
        return self.options.timings

    @property
    def lease(self) -> Lease:
        return self.fence.lease

    @property
    def deadlines(self) -> Deadlines:
        return cast(Deadlines, self.phase("deadlines"))

    def phase(self, name: str) -> Phase:
        """The loop's phase named ``name``."""
        return next(phase for phase in self.phases if phase.name == name)

    # --- lifecycle ---------------------------------------------------------------------------------

    def open(self) -> None:
        """Install the signal handlers (a signal from now on waits in the self-pipe for the loop), register,
        start the launcher. Stale leases are expired first (the daemon's poll then does it every ``expiry``)."""
        if self.host.install_signals:
            self.signals.install()
        self.db.send("register", self.db.ledger.register, self.registration)
        self._registered = True
        set_process_fields(runner_id=self.runner_id)
        log.info(
            "runner %s (%s) registered: kind %s, capabilities %s, concurrency %d, heartbeat %gs, lease %gs",
            self.runner_id, self.registration.name, self.registration.kind, ",".join(self.capabilities) or "-",
            self.options.concurrency, self.timings.heartbeat, self.timings.lease,
        )
        self.poll.expire_leases()  # the one-shot's too: a crashed earlier run must not hold the slot it needs
        self.launcher.start()
        info = self.launcher.info()
        if info.get("start_method") == "forkserver":
            log.info("fork server pid %s ready, preloaded %s in %ss", info.get("pid"),
                     ",".join(info.get("preloaded") or []) or "nothing", info.get("preload_seconds"))

    def serve(self) -> int:
        """The loop. Returns the process exit code."""
        self.heartbeat.beat()
        self._hand_over(self.requests)
        if self.services.notifier is not None:
            self.services.notifier.ready(self.status_line())
        self.poll.next_at = self.clock.monotonic()
        while not self._done():
            self.tick()
        return self.drain.exit_code

    def close(self) -> None:
        """Stop what is left (nothing, after a drain), close the launcher, mark the registry row stopped."""
        for child in list(self.children.values()):
            self.host.processes.signal_group(child.pid, signal.SIGKILL)
        self.launcher.close()
        for child in list(self.children.values()):
            child.close()
        self.children.clear()
        if self._registered:
            try:
                self.db.call("stop", self.db.ledger.stop, self.runner_id)
            except DatabaseDown:
                log.warning("could not mark the registry row stopped: %s", self.db.error)
            self._registered = False
        for service in (self.services.control, self.services.wakeup, self.services.gpu):
            if service is not None:
                service.close()
        self.signals.restore()

    def adopt(self, run: WorkerRun, resolved: ResolvedConfig) -> Child | None:
        """Start a child for a run this runner already holds (the one-shot CLI's own RUNNING row), with the
        resolution its validation made a moment ago (decision 0135)."""
        return self.starts.begin(run, self.clock.monotonic(), resolved)

    # --- the loop ------------------------------------------------------------------------------------

    def _done(self) -> bool:
        if self.children or self.starts.waiting:
            return False
        if self.loop.until_drained and not self.drain.draining:
            return False
        # Drained (or the one-shot's run ended): flush the finishes that could not be written and settle
        # the abandoned runs, unless the leases are over anyway (whoever expires them closes them).
        if self.finisher.settled and not self.starts.unstarted:
            return True
        return self.lease.margin() < 0

    def tick(self) -> None:
        """One wait, then every phase in order."""
        timeout = self.timeout()
        if not self.launcher.wait_fds() and self.children:
            timeout = min(timeout, NO_PIDFD_POLL)  # no pidfd on this kernel: poll the exits
        self.host.waiter.wait(self._readable(), timeout)
        for phase in self.phases:
            phase.run()
            if self.requests.pending():
                self._hand_over(self.requests)

    def _hand_over(self, requests: Requests) -> None:
        """What a phase asked of another, handed to the phase it is for, between two phases. A statement that
        met the fence point makes the fence phase run now, before the next phase (decision 0312)."""
        if requests.fence:
            self.fence.run()
        if requests.held is not None:
            self.finisher.settle(requests.held)
            self.starts.held(requests.held)
        if requests.claim and self.poll.may_claim():  # busy, draining or fenced: the poll would claim nothing
            self.poll.claim_now()  # the one-shot's loop has no poll: it never runs
        if requests.beat:
            self.heartbeat.beat_now()
        requests.fence = requests.claim = requests.beat = False
        requests.held = None

    def timeout(self) -> float:
        """Until the earliest moment a phase is due, at most ``MAX_SELECT_WAIT``."""
        now = self.clock.monotonic()
        moment = min([now + MAX_SELECT_WAIT, *(at for phase in self.phases for at in phase.due())])
        return max(0.0, moment - now)

    def _readable(self) -> list[int]:
        """Everything that can wake the loop: the self-pipe, exit reports, the children's channels and
        output, the control socket, the LISTEN connection."""
        fds: list[int | None] = [self.signals.read_fd, *self.launcher.wait_fds()]
        for child in self.children.values():
            fds += [None if child.reader.eof else child.channel.fileno(), child.output.fd]
        fds += [s.fileno() for s in (self.services.control, self.services.wakeup) if s is not None]
        return [fd for fd in fds if fd is not None]

    # --- what it shows -------------------------------------------------------------------------------

    @property
    def runner_id(self) -> uuid.UUID:
        return self.registration.runner_id

    @property
    def capabilities(self) -> list[str]:
        return list(self.registration.capabilities)

    @property
    def finished(self) -> dict[Any, WorkerRun | None]:
        """The rows the finisher wrote (None: finish touched no row), by run id."""
        return self.finisher.finished

    @property
    def counters(self) -> dict[str, int]:
        return self.finisher.counters

    @property
    def exit_code(self) -> int:
        return self.drain.exit_code

    def begin_drain(self, why: str) -> None:
        self.drain.begin(why)

    @property
    def state(self) -> str:
        """running | draining | fenced: what the status, the process title and systemd show."""
        return "draining" if self.drain.draining else ("fenced" if self.lease.fenced else "running")

    def status_line(self) -> str:
        return f"{self.state}: {len(self.children)}/{self.options.concurrency} busy, database {self.db.state}"

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """One control-socket request (``runner.control``)."""
        from runner.status import supervisor_status

        command = request.get("command", "status")
        if command == "status":
            self.heartbeat.sampler.sample()
            return supervisor_status(self)
        if command == "modules":
            from runner.guard import FORBIDDEN

            return {"pid": os.getpid(), "loaded": {name: name in sys.modules for name in FORBIDDEN},
                    "module_count": len(sys.modules)}
        if command == "drain":
            self.drain.begin("drain requested on the control socket")
            return {"draining": True}
        return {"error": f"unknown command {command!r}"}


# --- the small phases ------------------------------------------------------------------------------


class SignalPhase:
    """Phase ``signals`` (the daemon's): what the self-pipe holds (``runner.signals``). TERM/INT: drain; a
    second one, or QUIT: stop now."""

    name = "signals"

    def __init__(self, signals: SignalPipe, drain: Drain) -> None:
        self.signals = signals
        self.drain = drain

    def run(self) -> None:
        for signum in self.signals.read():
            if signum == signal.SIGCHLD:
                continue  # an exit: collected by the exits phase
            if signum == signal.SIGHUP:
                log.info("SIGHUP ignored (restart the service to change its flags)")
                continue
            self.on_signal(signum, signal_name(signum))

    def due(self) -> list[float]:
        return []

    def on_signal(self, signum: int, name: str) -> None:
        if signum == signal.SIGQUIT or self.drain.draining:
            self.drain.stop_now(f"{name} while draining" if self.drain.draining else name)
        else:
            self.drain.begin(f"{name} received")


class Interrupts(SignalPhase):
    """Phase ``interrupts`` (the one-shot CLI's): the first Ctrl-C cancels the run at its next batch
    boundary; another one, or a TERM, kills it."""

    name = "interrupts"

    def __init__(self, signals: SignalPipe, drain: Drain, children: dict[int, Child], effects: Effects,
                 db: LedgerLink, requested_by: str) -> None:
        super().__init__(signals, drain)
        self.children = children
        self.effects = effects
        self.db = db
        self.requested_by = requested_by

    def on_signal(self, signum: int, name: str) -> None:
        self.drain.interrupts += 1
        if signum == signal.SIGINT and self.drain.interrupts == 1:
            log.warning("Ctrl-C: cancelling at the next batch boundary (Ctrl-C again to kill the run)")
            for child in list(self.children.values()):
                try:
                    self.db.call("request_cancel", self.db.ledger.request_cancel, child.run.run_id, self.requested_by)
                except Exception as exc:  # the cooperative cancel does not need the row
                    log.debug("request_cancel failed: %s", exc)
                self.effects.request_cancel(child, "Ctrl-C")
            return
        log.warning("%s: killing the run", name)
        for child in list(self.children.values()):
            self.effects.signal(child, signal.SIGKILL, OPERATOR_INTERRUPT)


class ControlPhase:
    """Phase ``control``: ``scrinalia-runner status`` / ``drain``, never past the fence point."""

    name = "control"

    def __init__(self, control: ControlPort | None, answer: Callable[[dict[str, Any]], dict[str, Any]],
                 lease: Lease) -> None:
        self.control = control
        self.answer = answer
        self.lease = lease

    def run(self) -> None:
        if self.control is not None:
            self.control.serve_pending(self.answer, until=self.lease.fence_point())

    def due(self) -> list[float]:
        return []


class Watchdog:
    """Phase ``watchdog``: systemd's WATCHDOG=1 at its interval."""

    name = "watchdog"

    def __init__(self, clock: Clock, notifier: Any) -> None:
        self.clock = clock
        self.notifier = notifier
        self.next_at = 0.0

    def run(self) -> None:
        if self.notifier is None or not self.notifier.watchdog_interval:
            return
        now = self.clock.monotonic()
        if now >= self.next_at:
            self.notifier.watchdog()
            self.next_at = now + self.notifier.watchdog_interval

    def due(self) -> list[float]:
        return [self.next_at] if self.notifier is not None and self.notifier.watchdog_interval else []


class Title:
    """Phase ``title``: the process title (``ps``), set only when it changes."""

    name = "title"

    def __init__(self, runner_name: str, status_line: Callable[[], str], set_title: Callable[[str], None]) -> None:
        self.runner_name = runner_name
        self.status_line = status_line
        self.set_title = set_title
        self.title = ""

    def run(self) -> None:
        title = f"scrinalia-runner: supervisor {self.runner_name} [{self.status_line()}]"
        if title != self.title:
            self.title = title
            self.set_title(title)

    def due(self) -> list[float]:
        return []
