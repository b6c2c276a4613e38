"""The supervisor: one loop of named phases over a table of children (the arbiter).

Shaped like gunicorn's arbiter. One thread does everything. Each time ``select`` wakes it (a signal
through the self-pipe, a child's message, an exit report, a control request, or a timer), it runs the
phases below, in this order (``Supervisor.PHASES``; each is one ``_phase_NAME`` method):

    signals    TERM/INT: drain (a second one: stop now); the one-shot CLI: INT = cancel, again = kill
    wakeup     a notification: claim now, or beat now for a cancel request      (runner.lease)
    fence      the lease could not be renewed in time: SIGKILL every child, claim nothing (self-fence)
    children   their messages: started (ready time), progress, result; the channel's EOF (runner.tending)
    exits      exit reports; a run whose exit AND channel's end were observed goes to the finisher
    control    ``scrinalia-runner status`` over the unix socket
    heartbeat  ONE statement per interval: the registry row + every RUNNING row of this runner
    unstarted  claimed runs waiting for the database: resolve, ``record_start``, child (runner.claims)
    finishes   the finisher's writes that the database did not take, retried (runner.finisher)
    progress   ONE statement for the progress of every child that changed
    deadlines  --max-runtime, the cancel grace, the drain timeout, SIGTERM -> SIGKILL escalation
    poll       claim while a slot is free; per claim: resolve, ``record_start``, then the child;
               ``expire_leases`` on its own cadence (every lease/4)
    watchdog   systemd's watchdog
    title      the process title

Each run in the table has a state machine (``runner.run_state``): the phases feed it events and carry
out the effects it returns. ONE finisher (``runner.finisher``) decides and writes every terminal outcome.
No thread writes to the ledger, no callback runs from a signal handler (``runner.signals``). A database
error never kills the loop: the statement is retried later, and if the lease cannot be renewed before
``lease - fence_margin`` the children are killed before another runner may expire their rows.
See docs/architecture.md.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from runner import procinfo
from runner.children import Child
from runner.claims import Claims, ConfigurationError
from runner.devices import DevicePlanner
from runner.finisher import Finisher
from runner.launchers import Launcher, signal_name
from runner.lease import LeaseKeeping
from runner.ledger_link import DatabaseDown, LedgerLink, brief
from runner.loop_state import (
    MAX_SELECT_WAIT,
    ChildSetup,
    DrainState,
    LeaseState,
    Services,
    Timers,
    Uptime,
)
from runner.options import RunnerOptions
from runner.outcome import OPERATOR_INTERRUPT
from runner.signals import SignalPipe
from runner.tending import Tending
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import WorkerRun

log = logging.getLogger("scrinalia.runner")

_brief = brief  # the CLI's name for it
__all__ = ["Child", "ConfigurationError", "DatabaseDown", "MAX_SELECT_WAIT", "Supervisor", "_brief"]


class Supervisor(Tending, Claims, LeaseKeeping):
    """The parent of the runner's children. ``mode`` is "daemon" (claims from the queue) or "oneshot"."""

    PHASES = ("signals", "wakeup", "fence", "children", "exits", "control", "heartbeat", "unstarted",
              "finishes", "progress", "deadlines", "poll", "watchdog", "title")

    def __init__(
        self,
        options: RunnerOptions,
        *,
        engine: Engine,
        database_url: str,
        child_connect_args: dict[str, Any],
        launcher: Launcher,
        registration: registry.RunnerRegistration,
        mode: str = "daemon",
        notifier: Any = None,
        gpu: Any = None,
        devices: DevicePlanner | None = None,
        control: Any = None,
        wakeup: Any = None,
        on_progress: Callable[[Child], None] | None = None,
        install_signals: bool = True,
        catalogue: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in ("daemon", "oneshot"):
            raise ValueError(mode)
        self.options = options
        self.mode = mode
        self.launcher = launcher
        self.registration = registration
        self.services = Services(notifier, gpu, devices, control, wakeup, on_progress)
        self.setup = ChildSetup(database_url, child_connect_args, catalogue)
        self.db = LedgerLink(engine)
        self.db.fence_point, self.db.fence_check = self._fence_point, self._phase_fence  # decision 0110
        self.finisher = Finisher(self.db, registration.runner_id, options, launcher.name)
        self.children = {}
        self.unstarted = {}
        self.timers = Timers()
        self.lease = LeaseState()
        self.drain = DrainState()
        self.signals = SignalPipe()
        self.uptime = Uptime()
        self.exit_code = 0
        self._install_signals = install_signals
        self._registered = False
        self._title = ""

    # --- lifecycle ---------------------------------------------------------------------------------

    def open(self) -> None:
        """Install the signal handlers (a signal from now on waits in the self-pipe for the loop), register,
        start the launcher. The daemon also expires stale leases (at start, then every ``expiry_seconds``)."""
        if self._install_signals:
            self.signals.install()
        registry.register(self.db.engine, self.registration)
        self._registered = True
        log.info(
            "runner %s (%s) registered: kind %s, capabilities %s, concurrency %d, heartbeat %gs, lease %gs",
            self.runner_id, self.registration.name, self.registration.kind, ",".join(self.capabilities) or "-",
            self.options.concurrency, self.options.heartbeat_seconds, self.options.lease_seconds,
        )
        if self.mode == "daemon":
            self._expire_leases()
        self.launcher.start()
        info = self.launcher.info()
        if info.get("start_method") == "forkserver":
            log.info("fork server pid %s ready, preloaded %s in %ss", info.get("pid"),
                     ",".join(info.get("preloaded") or []) or "nothing", info.get("preload_seconds"))

    def serve(self) -> int:
        """The loop. Returns the process exit code."""
        self._heartbeat()
        if self.services.notifier is not None:
            self.services.notifier.ready(self._status_line())
        self.timers.poll = time.monotonic()
        while not self._done():
            self._tick()
        return self.exit_code

    def close(self) -> None:
        """Stop what is left (nothing, after a drain), close the launcher, mark the registry row stopped."""
        for child in list(self.children.values()):
            procinfo.kill_group(child.pid, signal.SIGKILL)
        self.launcher.close()
        for child in list(self.children.values()):
            child.close()
        self.children.clear()
        if self._registered:
            try:
                registry.stop(self.db.engine, self.runner_id)
            except SQLAlchemyError as exc:
                log.warning("could not mark the registry row stopped: %s", brief(exc))
            self._registered = False
        for service in (self.services.control, self.services.wakeup, self.services.gpu):
            if service is not None:
                service.close()
        self.signals.restore()

    def adopt(self, run: WorkerRun) -> Child | None:
        """Start a child for a run this runner already holds (the one-shot CLI's own RUNNING row)."""
        return self._begin(run, time.monotonic())

    @property
    def finished(self) -> dict[Any, WorkerRun | None]:
        """The rows the finisher wrote (None: finish touched no row), by run id."""
        return self.finisher.finished

    @property
    def counters(self) -> dict[str, int]:
        return self.finisher.counters

    # --- the loop ------------------------------------------------------------------------------------

    def _done(self) -> bool:
        if self.children:
            return False
        if self.mode == "daemon" and not self.drain.draining:
            return False
        # Drained (or the one-shot's run ended): flush the finishes that could not be written and settle
        # the abandoned runs, unless the leases are over anyway (whoever expires them closes them).
        if self.finisher.settled and not self.unstarted:
            return True
        return self.lease.margin() < 0

    def _tick(self) -> None:
        self._wait(self._timeout())
        for name in self.PHASES:
            getattr(self, f"_phase_{name}")()

    def _timeout(self) -> float:
        now = time.monotonic()
        moments = [self.timers.heartbeat, now + MAX_SELECT_WAIT, *self._service_moments(), *self._run_moments()]
        if self.mode == "daemon" and not self.drain.draining:
            moments.append(self.timers.poll)
        if self.lease.deadline is not None and self.children:
            moments.append(self.lease.deadline - self.options.fence_margin)
        if (self.finisher.pending or self.unstarted) and self.db.ok:
            moments.append(now)
        return max(0.0, min(moments) - now)

    def _run_moments(self) -> list[float]:
        """The children's deadlines, and the next progress statement when there is progress to write."""
        moments = [at for child in self.children.values() for at, _ in self._child_deadlines(child)]
        if not self.db.unreachable and self._progress_to_write():
            moments.append(self.timers.progress)
        return moments

    def _service_moments(self) -> list[float]:
        notifier, wakeup = self.services.notifier, self.services.wakeup
        moments = []
        if notifier is not None and notifier.watchdog_interval:
            moments.append(self.timers.watchdog)
        if wakeup is not None:
            moments.append(wakeup.due_at())
        return moments

    def _readable(self) -> list[Any]:
        """Everything that can wake the loop: the self-pipe, exit reports, the children's channels and
        output, the control socket, the LISTEN connection."""
        fds: list[Any] = [self.signals.read_fd, *self.launcher.wait_fds()]
        for child in self.children.values():
            fds += [None if child.reader.eof else child.channel, child.output.fd]
        fds += [s.fileno() for s in (self.services.control, self.services.wakeup) if s is not None]
        return [fd for fd in fds if fd is not None]

    def _wait(self, timeout: float) -> None:
        fds = self._readable()
        if not self.launcher.wait_fds() and self.children:
            timeout = min(timeout, 0.1)  # no pidfd on this kernel: poll the exits
        try:
            select.select(fds, [], [], timeout)
        except InterruptedError:
            pass
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise

    # --- the phases of this module --------------------------------------------------------------------

    def _phase_signals(self) -> None:
        for signum in self.signals.read():
            self._on_signal(signum)

    def _phase_control(self) -> None:
        if self.services.control is not None:
            self.services.control.serve_pending(self._control_request, until=self._fence_point())

    def _phase_finishes(self) -> None:
        if self.db.ok:
            self.finisher.retry()

    def _phase_watchdog(self) -> None:
        notifier = self.services.notifier
        if notifier is None or not notifier.watchdog_interval:
            return
        now = time.monotonic()
        if now >= self.timers.watchdog:
            notifier.watchdog()
            self.timers.watchdog = now + notifier.watchdog_interval

    def _phase_title(self) -> None:
        title = f"scrinalia-runner: supervisor {self.registration.name} [{self._status_line()}]"
        if title != self._title:
            self._title = title
            procinfo.set_title(title)

    # --- signals and the drain -------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        name = signal_name(signum)
        if signum == signal.SIGCHLD:
            return  # an exit: collected by the exits phase
        if signum == signal.SIGHUP:
            log.info("SIGHUP ignored (restart the service to change its flags)")
            return
        if self.mode == "oneshot":
            self._oneshot_signal(signum, name)
            return
        if signum == signal.SIGQUIT or self.drain.draining:
            self._stop_now(f"{name} while draining" if self.drain.draining else name)
        else:
            self.begin_drain(f"{name} received")

    def _oneshot_signal(self, signum: int, name: str) -> None:
        self.drain.interrupts += 1
        if signum == signal.SIGINT and self.drain.interrupts == 1:
            log.warning("Ctrl-C: cancelling at the next batch boundary (Ctrl-C again to kill the run)")
            for child in list(self.children.values()):
                try:
                    ledger.request_cancel(self.db.engine, child.run.run_id, self.registration.name)
                except Exception as exc:  # the cooperative cancel does not need the row
                    log.debug("request_cancel failed: %s", brief(exc))
                self._request_cancel(child, "Ctrl-C")
            return
        log.warning("%s: killing the run", name)
        for child in list(self.children.values()):
            self._signal(child, signal.SIGKILL, OPERATOR_INTERRUPT)

    def begin_drain(self, why: str) -> None:
        """Stop claiming; let the children finish until the drain timeout; then stop them."""
        if self.drain.draining:
            return
        self.drain.draining, self.drain.reason = True, why
        self.drain.deadline = time.monotonic() + self.options.drain_timeout
        log.warning("draining (%s): no more claims; %d running, deadline in %gs",
                    why, len(self.children), self.options.drain_timeout)
        if self.services.notifier is not None:
            self.services.notifier.stopping(f"draining: {why}")

    def _stop_now(self, why: str) -> None:
        if not self.drain.draining:
            self.begin_drain(why)
        log.warning("stopping now (%s)", why)
        self.drain.deadline = time.monotonic()

    # --- what it shows -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """running | draining | fenced: what the status, the process title and systemd show."""
        return "draining" if self.drain.draining else ("fenced" if self.lease.fenced else "running")

    def _status_line(self) -> str:
        return f"{self.state}: {len(self.children)}/{self.options.concurrency} busy, database {self.db.state}"

    def _control_request(self, request: dict[str, Any]) -> dict[str, Any]:
        from runner.status import supervisor_status

        command = request.get("command", "status")
        if command == "status":
            self._sample_resources()
            return supervisor_status(self)
        if command == "modules":
            from runner.guard import FORBIDDEN

            return {"pid": os.getpid(), "loaded": {name: name in sys.modules for name in FORBIDDEN},
                    "module_count": len(sys.modules)}
        if command == "drain":
            self.begin_drain("drain requested on the control socket")
            return {"draining": True}
        return {"error": f"unknown command {command!r}"}
