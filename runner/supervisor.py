"""The supervisor: one loop, a table of children, and every lifecycle write (the arbiter).

Shaped like gunicorn's arbiter. One thread does everything, in this order, each time ``select`` wakes
it (a signal through the self-pipe, a child's message, an exit report, a control request, or a timer):

    signals   TERM/INT: drain (a second one: stop now); the one-shot CLI: INT = cancel, again = kill
    fence     the lease could not be renewed in time: SIGKILL every child, claim nothing (self-fence)
    children  messages: resolved -> record_start (fenced) -> "start"; progress; result
    exits     a child's exit -> its outcome -> ``finish`` (fenced); 0 rows -> the run was lost
    control   ``scrinalia-runner status`` over the unix socket
    heartbeat ONE statement per interval: the registry row + every RUNNING row of this runner
              (a row missing from its answer is lost: SIGKILL that child, write nothing more)
    deadlines --max-runtime, the cancel grace, the drain timeout, SIGTERM -> SIGKILL escalation
    poll      claim while a slot is free, one child per claim; ``expire_leases`` on its own cadence
              (at start, then every lease/4: it only has to be faster than the lease, not every poll)

There are no threads writing to the ledger, no callbacks from signal handlers: a signal handler only
writes the signal number to the self-pipe (``signal.set_wakeup_fd``), the loop reads it.

Every ledger write of the parent is one of the protocol's fenced statements. A database error never
kills the loop: the statement is retried on the next heartbeat, and if the lease cannot be renewed
before ``lease - fence_margin`` the children are killed before another runner may expire their rows.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from runner import bounded, procinfo, wire
from runner.devices import Device, DevicePlanner, Placement, child_env
from runner.launchers import ChildExit, Launcher, signal_name
from runner.options import RunnerOptions
from runner.outcome import Outcome, decide
from runner.stall import Action, StallWatch, cpu_seconds

from scrinalia.db.engine import ServerFacts
from scrinalia.db.errors import classify_database_error
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.worker_settings import get_settings

log = logging.getLogger("scrinalia.runner")

OUTPUT_TAIL_BYTES = 16 * 1024
PROGRESS_INTERVAL = 0.5  # seconds between two progress statements: the panel sees progress within ~1 s
RELAY_LINE_MAX = 500
MAX_SELECT_WAIT = 1.0


class DatabaseDown(Exception):
    """A ledger statement failed; the loop goes on and retries."""


@dataclass(eq=False)
class Child:
    """One entry of the supervisor's table: a claimed run and the process that runs it."""

    run: WorkerRun
    pid: int
    channel: socket.socket
    output_fd: int | None
    claimed_at: float                    # CLOCK_MONOTONIC, just after the claim returned
    ready_at: float | None = None        # the worker's code started (the child's CLOCK_MONOTONIC)
    resolved: dict[str, Any] | None = None  # waiting for record_start
    progress: dict[str, Any] | None = None
    progress_written: dict[str, Any] | None = None  # what record_progress last wrote for it
    result: dict[str, Any] | None = None
    result_at: float | None = None
    cancel_sent_at: float | None = None
    kill_reason: str | None = None       # timeout | cancel-forced | runner-stopped | operator-interrupt
    signals_sent: set[int] = field(default_factory=set)
    term_sent_at: float | None = None
    lost: bool = False                   # the row is not ours any more: write nothing for it
    fenced: bool = False                 # killed by the self-fence: the next heartbeat decides
    oom_kills_at_start: int | None = None
    rss_bytes: int | None = None
    gpu_bytes: int | None = None
    gpu_peak_bytes: int = 0
    device: Device | None = None         # the GPU it was given (CUDA_VISIBLE_DEVICES), or None
    gpu_need_bytes: int | None = None    # the GPU memory its worker declared
    stall: StallWatch | None = None      # its liveness while the worker runs (runner.stall)
    output_tail: bytearray = field(default_factory=bytearray)
    partial_line: bytearray = field(default_factory=bytearray)
    reader: wire.FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = wire.FrameReader(self.channel)

    @property
    def phase(self) -> str:
        """starting -> running -> finishing -> stopping, read off what the child said and what it was sent
        (a stored phase could disagree with them)."""
        if self.signals_sent:
            return "stopping"
        if self.result is not None:
            return "finishing"
        return "running" if self.ready_at is not None else "starting"

    @property
    def short_id(self) -> str:
        return self.run.run_id.hex[:8]

    def tail_text(self, max_lines: int = 25) -> str:
        text = self.output_tail.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-max_lines:])

    def snapshot(self, now: float) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "run_id": str(self.run.run_id),
            "worker": self.run.worker_name,
            "phase": self.phase,
            "elapsed_seconds": round(now - self.claimed_at, 3),
            "progress": self.progress,
            "rss_bytes": self.rss_bytes,
            "gpu_memory_bytes": self.gpu_bytes,
            "device": self.device.describe() if self.device is not None else None,
            "cancel_requested": self.cancel_sent_at is not None,
        }


class Supervisor:
    """The parent of the runner's children. ``mode`` is "daemon" (claims from the queue) or "oneshot"."""

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
    ) -> None:
        if mode not in ("daemon", "oneshot"):
            raise ValueError(mode)
        self.options = options
        self.engine = engine
        self.database_url = database_url
        self.child_connect_args = child_connect_args
        self.launcher = launcher
        self.registration = registration
        self.runner_id: uuid.UUID = registration.runner_id
        self.capabilities = list(registration.capabilities)
        self.mode = mode
        self.notifier = notifier
        self.gpu = gpu
        self.devices = devices  # None (the one-shot CLI): the child sees what the shell sees
        self.control = control
        self.wakeup = wakeup  # runner.wakeup.Wakeup: claim on the ledger's notification (None: poll only)
        self.on_progress = on_progress
        self.install_signals = install_signals

        self.children: dict[int, Child] = {}
        self.finished: dict[uuid.UUID, WorkerRun | None] = {}
        self.pending_finishes: list[tuple[WorkerRun, Outcome]] = []
        self.abandoned: dict[uuid.UUID, tuple[WorkerRun, str]] = {}
        self.counters = {k: 0 for k in ("claimed", "SUCCESS", "FAILED", "CANCELLED", "INTERRUPTED", "lost")}

        self.started_wall = time.time()
        self.started_mono = time.monotonic()
        self.registered = False
        self.draining = False
        self.drain_reason: str | None = None
        self.drain_deadline: float | None = None
        self.fenced = False
        self.db_state = "unknown"
        self.db_error: str | None = None
        self.last_heartbeat_ok: float | None = None
        self.lease_deadline: float | None = None
        self.next_heartbeat = 0.0
        self.next_poll = 0.0
        self.next_expiry = 0.0
        self.last_children: list[dict[str, Any]] | None = None  # the registry's snapshot, as last written
        self.statements: dict[str, int] = {}  # protocol statements sent, by step (the status shows them)
        self.next_watchdog = 0.0
        self.next_progress = 0.0
        self.interrupts = 0
        self.exit_code = 0
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self._old_wakeup: int | None = None
        self._title = ""

    # --- lifecycle ---------------------------------------------------------------------------------

    def open(self) -> None:
        """Install the signal handlers (a signal from now on waits in the self-pipe for the loop), register,
        start the launcher. The daemon also expires stale leases (at start, then every ``expiry_seconds``)."""
        if self.install_signals:
            self._install_signals()
        registry.register(self.engine, self.registration)
        self.registered = True
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
        if self.notifier is not None:
            self.notifier.ready(self._status_line())
        self.next_poll = time.monotonic()
        while not self._done():
            self._tick()
        return self.exit_code

    def close(self) -> None:
        """Stop what is left (nothing, after a drain), close the launcher, mark the registry row stopped."""
        for child in list(self.children.values()):
            procinfo.kill_group(child.pid, signal.SIGKILL)
        self.launcher.close()
        for child in list(self.children.values()):
            self._close_child(child)
        self.children.clear()
        if self.registered:
            try:
                registry.stop(self.engine, self.runner_id)
            except SQLAlchemyError as exc:
                log.warning("could not mark the registry row stopped: %s", _brief(exc))
            self.registered = False
        if self.control is not None:
            self.control.close()
        if self.wakeup is not None:
            self.wakeup.close()
        if self.gpu is not None:
            self.gpu.close()
        if self._old_handlers:
            self._restore_signals()

    def adopt(self, run: WorkerRun) -> Child | None:
        """Start a child for a run this runner already holds (the one-shot CLI's own RUNNING row)."""
        return self._start_child(run)

    # --- the loop ------------------------------------------------------------------------------------

    def _done(self) -> bool:
        if self.children:
            return False
        if self.mode == "daemon" and not self.draining:
            return False
        # Drained (or the one-shot's run ended): flush the finishes that could not be written and settle
        # the abandoned runs, unless the leases are over anyway (whoever expires them closes them).
        if not self.pending_finishes and not self.abandoned:
            return True
        return self._lease_margin() < 0

    def _tick(self) -> None:
        self._wait(self._timeout())
        self._read_signals()
        self._read_wakeup()
        self._check_lease_margin()
        for child in list(self.children.values()):
            self._pump(child)
        self._collect_exits()
        if self.control is not None:
            self.control.serve_pending(self._control_request, until=self._fence_point())
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self._heartbeat()
        self._retry_pending()
        self._flush_progress()
        self._enforce_deadlines()
        if self.mode == "daemon" and time.monotonic() >= self.next_poll:
            self._poll()
        self._maybe_watchdog()
        self._retitle()

    def _timeout(self) -> float:
        now = time.monotonic()
        moments = [self.next_heartbeat, now + MAX_SELECT_WAIT]
        if self.mode == "daemon" and not self.draining:
            moments.append(self.next_poll)
        if self.lease_deadline is not None and self.children:
            moments.append(self.lease_deadline - self.options.fence_margin)
        if self.notifier is not None and self.notifier.watchdog_interval:
            moments.append(self.next_watchdog)
        if self.wakeup is not None:
            moments.append(self.wakeup.due_at())
        if self.db_state != "unreachable" and self._progress_to_write():
            moments.append(self.next_progress)
        for child in self.children.values():
            moments.extend(at for at, _ in self._child_deadlines(child))
        if self.pending_finishes and self.db_state == "ok":
            moments.append(now)
        return max(0.0, min(moments) - now)

    def _child_deadlines(self, child: Child) -> list[tuple[float, Callable[[], None]]]:
        """What falls due for ``child``, and when. One list for both ends, so that the loop never sleeps
        until a moment at which it then does nothing (a deadline in the past would spin it):
        ``_timeout`` sleeps until the earliest, ``_enforce_deadlines`` does what is due."""
        if child.lost or child.fenced:
            return []  # SIGKILLed already: only its exit is awaited
        opts = self.options
        due: list[tuple[float, Callable[[], None]]] = []
        if child.kill_reason is None and child.result is None:
            if opts.max_runtime:
                due.append((child.claimed_at + opts.max_runtime, lambda: self._stop_overdue(child)))
            if child.cancel_sent_at is not None:
                due.append((child.cancel_sent_at + opts.cancel_grace, lambda: self._force_cancel(child)))
            if self.draining and self.drain_deadline is not None:
                due.append((self.drain_deadline, lambda: self._stop_at_drain_deadline(child)))
            stall_at = child.stall.due_at() if child.stall is not None else None
            if stall_at is not None:
                due.append((stall_at, lambda: self._check_stall(child)))
        if signal.SIGKILL not in child.signals_sent:
            # SIGTERM was not enough; or the child sent its result but does not exit.
            for since in (child.term_sent_at, child.result_at):
                if since is not None:
                    due.append((since + opts.kill_grace, lambda: self._signal(child, signal.SIGKILL)))
        return due

    def _wait(self, timeout: float) -> None:
        fds: list[Any] = []
        if self._wake_r is not None:
            fds.append(self._wake_r)
        exit_fds = self.launcher.wait_fds()
        fds.extend(exit_fds)
        for child in self.children.values():
            if not child.reader.eof:
                fds.append(child.channel)
            if child.output_fd is not None:
                fds.append(child.output_fd)
        if self.control is not None and self.control.fileno() is not None:
            fds.append(self.control.fileno())
        if self.wakeup is not None and self.wakeup.fileno() is not None:
            fds.append(self.wakeup.fileno())
        if not exit_fds and self.children:
            timeout = min(timeout, 0.1)  # no pidfd on this kernel: poll the exits
        try:
            select.select(fds, [], [], timeout)
        except InterruptedError:
            pass
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise

    # --- signals -------------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            self._old_handlers[sig] = signal.signal(sig, _noop_handler)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
        for fd in (self._wake_r, self._wake_w):
            if fd is not None:
                os.close(fd)
        self._wake_r = self._wake_w = None

    def _read_signals(self) -> None:
        if self._wake_r is None:
            return
        try:
            data = os.read(self._wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        name = signal_name(signum)
        if signum == signal.SIGCHLD:
            return  # an exit: collected below
        if signum == signal.SIGHUP:
            log.info("SIGHUP ignored (restart the service to change its flags)")
            return
        if self.mode == "oneshot":
            self._oneshot_signal(signum, name)
            return
        if signum == signal.SIGQUIT or self.draining:
            self._stop_now(f"{name} while draining" if self.draining else name)
        else:
            self.begin_drain(f"{name} received")

    def _oneshot_signal(self, signum: int, name: str) -> None:
        if signum == signal.SIGINT and self.interrupts == 0:
            self.interrupts += 1
            log.warning("Ctrl-C: cancelling at the next batch boundary (Ctrl-C again to kill the run)")
            for child in self.children.values():
                try:
                    ledger.request_cancel(self.engine, child.run.run_id, self.registration.name)
                except Exception as exc:  # the cooperative cancel does not need the row
                    log.debug("request_cancel failed: %s", _brief(exc))
                self._request_cancel(child, "Ctrl-C")
            return
        self.interrupts += 1
        log.warning("%s: killing the run", name)
        for child in self.children.values():
            self._signal(child, signal.SIGKILL, "operator-interrupt")

    def begin_drain(self, why: str) -> None:
        """Stop claiming; let the children finish until the drain timeout; then stop them."""
        if self.draining:
            return
        self.draining = True
        self.drain_reason = why
        self.drain_deadline = time.monotonic() + self.options.drain_timeout
        log.warning("draining (%s): no more claims; %d running, deadline in %gs",
                    why, len(self.children), self.options.drain_timeout)
        if self.notifier is not None:
            self.notifier.stopping(f"draining: {why}")

    def _stop_now(self, why: str) -> None:
        if not self.draining:
            self.begin_drain(why)
        log.warning("stopping now (%s)", why)
        self.drain_deadline = time.monotonic()

    # --- the database ---------------------------------------------------------------------------------

    def _db(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._check_lease_margin()  # no step starts past the fence point with live children
        self.statements[what] = self.statements.get(what, 0) + 1
        try:
            with bounded.until(self.engine, self._fence_point()):  # nor outlives it (runner.bounded)
                result = fn(self.engine, *args, **kwargs)
        except SQLAlchemyError as exc:
            self._check_lease_margin()
            state = classify_database_error(exc)  # blocked | unreachable | error (decision 0103)
            if self.db_state != state:
                log.error("database %s: %s failed: %s", state, what, _brief(exc))
            self.db_state = state
            self.db_error = type(getattr(exc, "orig", None) or exc).__name__
            raise DatabaseDown(what) from None
        if self.db_state not in ("ok", "unknown"):
            log.warning("database: answers again (%s)", what)
        self.db_state, self.db_error = "ok", None
        return result

    def _expire_leases(self) -> None:
        self.next_expiry = time.monotonic() + self.options.expiry_seconds
        try:
            expired = self._db("expire_leases", ledger.expire_leases)
        except DatabaseDown:
            return
        for run in expired:
            log.warning("run %s (%s) of runner %s: lease expired -> INTERRUPTED", run.run_id,
                        run.worker_name, run.runner_id)

    # --- heartbeat and the self-fence ------------------------------------------------------------------

    def _fence_point(self) -> float | None:
        """When the children must be dead if the lease is not renewed (None: no live child to fence)."""
        if self.lease_deadline is None or all(c.lost or c.fenced for c in self.children.values()):
            return None
        return self.lease_deadline - self.options.fence_margin

    def _bounded_wait(self, seconds: float) -> float:
        """``seconds``, clipped to the fence point: how long the loop may wait on anything now."""
        point = self._fence_point()
        return seconds if point is None else max(0.0, min(seconds, point - time.monotonic()))

    def _lease_margin(self) -> float:
        if self.lease_deadline is None:
            return float("inf")
        return self.lease_deadline - time.monotonic()

    def _heartbeat(self) -> None:
        sent = time.monotonic()
        self._sample_resources()
        progress = {c.run.run_id: c.progress for c in self.children.values() if c.progress and not c.lost}
        snapshot = [c.snapshot(sent) for c in self.children.values() if not c.lost]
        try:
            # An unchanged snapshot (an idle runner's []) is not sent: the row keeps the one it has.
            beat = self._db(
                "heartbeat", ledger.heartbeat, self.runner_id, self.options.lease_seconds,
                progress=progress, children=None if snapshot == self.last_children else snapshot,
            )
        except DatabaseDown:
            self.next_heartbeat = sent + min(1.0, self.options.heartbeat_seconds)
            return
        self.last_children = snapshot
        self.next_heartbeat = sent + self.options.heartbeat_seconds
        self.last_heartbeat_ok = sent
        # Measured from before the statement was sent: conservative by the round trip.
        self.lease_deadline = sent + (beat.lease_expires_at - beat.db_now).total_seconds()
        if self.fenced:
            log.warning("the database answers again: claiming resumes")
            self.fenced = False
        if not beat.registry_renewed:
            log.error("the registry row %s is gone; runs stay fenced by runner_id", self.runner_id)
        for child in list(self.children.values()):
            if child.lost or child.fenced:
                continue
            if child.run.run_id not in beat.held:
                self._lose(child, "its row was not renewed by the heartbeat (expired or taken by another runner)")
            elif beat.held[child.run.run_id] is not None and child.cancel_sent_at is None:
                self._request_cancel(child, "cancel requested")
        for run_id, (run, error) in list(self.abandoned.items()):
            del self.abandoned[run_id]
            if run_id in beat.held:
                log.warning("run %s (%s): still held after its child was stopped -> INTERRUPTED lease-lost",
                            run_id, run.worker_name)
                self._finish(run, Outcome(status="INTERRUPTED", exit_reason="lease-lost", error=error))
            else:
                self.counters["lost"] += 1
                log.warning("run %s (%s) lost: not held any more (expired, or taken by another runner); "
                            "nothing written", run_id, run.worker_name)
        if beat.drain_requested_at is not None and not self.draining:
            self.begin_drain("drain requested in the registry")

    def _check_lease_margin(self) -> None:
        margin = self._lease_margin()
        if margin > self.options.fence_margin:
            return
        live = [c for c in self.children.values() if not c.lost and not c.fenced]
        if not self.fenced and live:
            log.critical(
                "self-fence: the lease could not be renewed in time (%.1fs of margin left); killing %d children "
                "and claiming nothing until the database answers", margin, len(live),
            )
        elif not self.fenced:
            log.warning("the lease could not be renewed in time; claiming nothing until the database answers")
        self.fenced = True
        for child in live:
            child.fenced = True
            self._signal(child, signal.SIGKILL)

    def _lose(self, child: Child, why: str) -> None:
        child.lost = True
        self.counters["lost"] += 1
        log.error("run %s (%s) lost: %s; killing child %d; nothing more is written for it",
                  child.run.run_id, child.run.worker_name, why, child.pid)
        self._signal(child, signal.SIGKILL)

    # --- notifications and progress (decision 0080) ----------------------------------------------

    def _read_wakeup(self) -> None:
        """A QUEUED run we can claim was announced (or the LISTEN restarted): poll now. A cancel request
        for a child that was not told yet: beat now, the heartbeat's answer hands it over."""
        if self.wakeup is None or self.mode != "daemon":
            return
        news = self.wakeup.read()
        now = time.monotonic()
        if news.claim and self._may_claim():  # busy, draining or fenced: the poll would claim nothing
            self.next_poll = min(self.next_poll, now)
        if any(c.run.run_id in news.cancelled and c.cancel_sent_at is None for c in self.children.values()):
            self.next_heartbeat = min(self.next_heartbeat, now)

    def _poll_interval(self) -> float:
        """While the LISTEN is up the poll is only the safety net: --listen-poll, but at most a quarter of
        the lease (the poll also expires other runners' leases, which must not wait much past their end);
        never faster than --poll. Without the LISTEN: --poll."""
        opts = self.options
        if self.wakeup is not None and self.wakeup.listening:
            return max(opts.poll_seconds, min(opts.listen_poll_seconds, opts.lease_seconds / 4))
        return opts.poll_seconds

    def _progress_to_write(self) -> dict[uuid.UUID, dict[str, Any]]:
        return {c.run.run_id: c.progress for c in self.children.values()
                if c.progress is not None and c.progress != c.progress_written and not (c.lost or c.fenced)}

    def _flush_progress(self) -> None:
        """ONE statement for every child whose progress changed, at most every PROGRESS_INTERVAL; separate
        from the heartbeat, whose cadence is the lease's. A failure waits for the next interval."""
        now = time.monotonic()
        if now < self.next_progress or self.db_state == "unreachable":
            return
        pending = self._progress_to_write()
        if not pending:
            return
        self.next_progress = now + PROGRESS_INTERVAL
        try:
            self._db("record_progress", ledger.record_progress, self.runner_id, pending)
        except DatabaseDown:
            return
        for child in self.children.values():
            if child.run.run_id in pending:
                child.progress_written = pending[child.run.run_id]

    # --- claims and children ------------------------------------------------------------------------

    def _may_claim(self) -> bool:
        return (
            not self.draining
            and not self.fenced
            and self.db_state == "ok"
            and self.launcher.healthy()
            and not getattr(self.launcher, "stalled", False)
            and len(self.children) < self.options.concurrency
        )

    def _poll(self) -> None:
        self.next_poll = time.monotonic() + self._poll_interval()
        if self.db_state == "unreachable":
            return  # the heartbeat's retry is the probe: our own rows are renewed before anything expires
        if time.monotonic() >= self.next_expiry:
            self._expire_leases()
        if self.devices is not None and self.devices.devices and self.children:
            self._sample_resources()  # the memory rule reads what the children use now
        while self._may_claim():
            capabilities = self._claimable()
            if not capabilities:
                return  # every device slot is taken and no CPU-only worker is claimable
            try:
                run = self._db("claim", ledger.claim_next, self.runner_id, capabilities, self.options.lease_seconds)
            except DatabaseDown:
                return
            if run is None:
                return
            self.counters["claimed"] += 1
            self._start_child(run)

    def _placements(self) -> list[Placement]:
        return [Placement(c.device.key, c.gpu_need_bytes, c.gpu_bytes) for c in self.children.values()
                if c.device is not None]

    def device_status(self) -> list[dict[str, Any]]:
        """The owned devices, each with its slots and the children on it (``status``)."""
        if self.devices is None:
            return []
        on: dict[str, list[int]] = {}
        for c in self.children.values():
            if c.device is not None:
                on.setdefault(c.device.key, []).append(c.pid)
        return [{**d.describe(), "memory_total_bytes": d.memory_total_bytes, "slots": self.devices.per_device,
                 "children": on.get(d.key, [])} for d in self.devices.devices]

    def _claimable(self) -> list[str]:
        """The capability list of the next claim: the device rule (``runner.devices``) decides which
        workers a free slot (and the free GPU memory) allows now; the claim stays one statement."""
        if self.devices is None:
            return self.capabilities
        return self.devices.claimable(self.capabilities, self._placements())

    def _start_child(self, run: WorkerRun) -> Child | None:
        claimed_at = time.monotonic()
        device = self.devices.place(run.worker_name, self._placements()) if self.devices is not None else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            wait = max(0.02, self._bounded_wait(self.options.spawn_seconds))  # a stopped fork server
            pid = self.launcher.spawn(theirs.fileno(), out_w, timeout=wait)
        except Exception as exc:
            ours.close()
            os.close(out_r)
            log.error("run %s (%s): could not start a child: %s", run.run_id, run.worker_name, _brief(exc))
            self._finish(run, Outcome(status="FAILED", exit_reason="exception",
                                      error=f"ChildStartFailed: {type(exc).__name__}: {exc}"[:500]))
            return None
        finally:
            theirs.close()
            os.close(out_w)
        os.set_blocking(out_r, False)
        child = Child(run=run, pid=pid, channel=ours, output_fd=out_r, claimed_at=claimed_at,
                      oom_kills_at_start=procinfo.oom_kill_counter(), device=device,
                      gpu_need_bytes=self.devices.need(run.worker_name).memory_bytes if device is not None else None)
        self.children[pid] = child
        persisted = self._persisted_settings(run.worker_name)  # while the child starts
        try:
            facts = ServerFacts.of(self.engine)
            wire.send(ours, "assign", {
                "run": run,
                "env": child_env(device) if self.devices is not None else {},
                "database_url": self.database_url,
                "connect_args": self.child_connect_args,
                # What the child's engine would otherwise ask its first connection (decision 0073).
                "server_facts": facts.to_json() if facts is not None else None,
                # The resolver's read, made here on a warm connection: a child that never touches the
                # database beyond it opens no session at all (decision 0074). None: the child reads it.
                "persisted_settings": persisted,
                "preload": list(self.launcher.child_preload),
            })
        except OSError as exc:
            log.error("run %s: the child %d did not take its assignment: %s", run.run_id, pid, exc)
        ours.setblocking(False)
        log.info("run %s (%s) -> child %d%s", run.run_id, run.worker_name, pid,
                 f" on GPU {device.key}" if device is not None else "")
        return child

    def _persisted_settings(self, worker_name: str) -> dict[str, Any] | None:
        """``{"row": the worker's archive_worker_settings row or None}``, or None when it could not be read."""
        try:
            return {"row": self._db("settings", get_settings, worker_name)}
        except DatabaseDown:
            return None

    def _send(self, child: Child, kind: str, payload: dict[str, Any] | None = None) -> None:
        try:
            child.channel.sendall(wire.encode(kind, payload))
        except (BlockingIOError, OSError) as exc:
            log.debug("child %d: %s not delivered: %s", child.pid, kind, exc)

    def _pump(self, child: Child) -> None:
        """Read the child's messages and output."""
        self._read_output(child)
        if child.reader.eof:
            return
        try:
            messages = child.reader.read()
        except Exception as exc:  # not our framing: the child is not speaking the protocol any more
            log.error("run %s: unreadable message from child %d (%s); killing it", child.short_id, child.pid,
                      type(exc).__name__)
            child.reader.eof = True
            self._signal(child, signal.SIGKILL)
            return
        if messages and child.stall is not None:
            child.stall.heard(time.monotonic())
        for kind, payload in messages:
            self._on_message(child, kind, payload)

    def _on_message(self, child: Child, kind: str, payload: dict[str, Any]) -> None:
        if kind == "resolved":
            child.resolved = payload
            self._record_start(child)
        elif kind == "started":
            child.ready_at = float(payload["t"])
            own = payload.get("stall_timeout")
            child.stall = StallWatch(self.options.stall_timeout if own is None else float(own), time.monotonic())
            latency = (child.ready_at - child.claimed_at) * 1000
            log.info("run %s: worker %s running in child %d (%.0f ms after the claim)",
                     child.short_id, child.run.worker_name, child.pid, latency)
        elif kind == "progress":
            child.progress = payload
            if self.on_progress is not None:
                self.on_progress(child)
        elif kind == "result":
            child.result = payload
            child.result_at = time.monotonic()
            if payload.get("progress"):
                child.progress = payload["progress"]

    def _record_start(self, child: Child) -> None:
        if child.lost or child.fenced or child.resolved is None:
            return
        resolved = child.resolved
        config = dict(resolved.get("config") or {})
        for key in ("db_batch_size", "engine_options", "sources"):
            if key in resolved:
                config.setdefault(key, resolved[key])
        try:
            held = self._db(
                "record_start", ledger.record_start, child.run.run_id, self.runner_id,
                engine_name=resolved.get("engine_name"), preset=resolved.get("preset"),
                config=config, options=resolved.get("options") or {},
            )
        except DatabaseDown:
            return  # retried by _retry_pending while child.resolved is set
        child.resolved = None
        if held:
            self._send(child, "start")
        else:
            self._lose(child, "record_start touched no row")

    def _read_output(self, child: Child) -> None:
        fd = child.output_fd
        if fd is None:
            return
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._relay(child, final=True)
                os.close(fd)
                child.output_fd = None
                return
            child.output_tail += data
            if len(child.output_tail) > OUTPUT_TAIL_BYTES:
                del child.output_tail[: len(child.output_tail) - OUTPUT_TAIL_BYTES]
            child.partial_line += data
            self._relay(child)

    def _relay(self, child: Child, final: bool = False) -> None:
        """The child's output, line by line, into the supervisor's log (the journal)."""
        *lines, rest = bytes(child.partial_line).split(b"\n")
        if final and rest:
            lines.append(rest)
            rest = b""
        child.partial_line = bytearray(rest[-OUTPUT_TAIL_BYTES:])
        for line in lines:
            text = line.decode("utf-8", errors="replace").rstrip("\r")
            if text.strip():
                log.info("[run %s %s] %s", child.short_id, child.run.worker_name, text[:RELAY_LINE_MAX])

    def _request_cancel(self, child: Child, why: str) -> None:
        if child.cancel_sent_at is not None or child.lost:
            return
        child.cancel_sent_at = time.monotonic()
        log.info("run %s (%s): %s; the worker stops at its next batch boundary (grace %gs)",
                 child.short_id, child.run.worker_name, why, self.options.cancel_grace)
        self._send(child, "cancel")

    def _signal(self, child: Child, sig: int, reason: str | None = None) -> None:
        if reason is not None and child.kill_reason is None:
            child.kill_reason = reason
        if sig in child.signals_sent and sig == signal.SIGKILL:
            return
        child.signals_sent.add(sig)
        if sig == signal.SIGTERM:
            child.term_sent_at = time.monotonic()
        procinfo.kill_group(child.pid, sig)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            for at, act in self._child_deadlines(child):
                if at <= now:
                    act()
                    break  # what it did changes what falls due next: the next tick (at once) decides

    def _check_stall(self, child: Child) -> None:
        """The child's stall deadline fell due: probe its CPU time, dump its stack, or stop it."""
        assert child.stall is not None
        action = child.stall.check(time.monotonic(), cpu_seconds(child.pid))
        if action is Action.DUMP_STACK:
            log.error("run %s (%s): child %d sent nothing and used no CPU for %.0fs (stall timeout %gs); "
                      "dumping its stack, then stopping it", child.short_id, child.run.worker_name, child.pid,
                      child.stall.silent_seconds_at_dump or 0, child.stall.timeout)
            try:
                os.kill(child.pid, signal.SIGUSR1)  # the child only: SIGUSR1 would kill what it started
            except ProcessLookupError:
                pass
        elif action is Action.TERMINATE:
            self._signal(child, signal.SIGTERM, "stalled")

    def _stop_overdue(self, child: Child) -> None:
        log.error("run %s (%s): over --max-runtime %gs; killing child %d",
                  child.short_id, child.run.worker_name, self.options.max_runtime, child.pid)
        self._signal(child, signal.SIGKILL, "timeout")

    def _force_cancel(self, child: Child) -> None:
        log.warning("run %s (%s): still running %gs after the cancel request; SIGTERM",
                    child.short_id, child.run.worker_name, self.options.cancel_grace)
        self._signal(child, signal.SIGTERM, "cancel-forced")

    def _stop_at_drain_deadline(self, child: Child) -> None:
        log.warning("run %s (%s): drain timeout; SIGTERM to child %d",
                    child.short_id, child.run.worker_name, child.pid)
        self._signal(child, signal.SIGTERM, "runner-stopped")

    # --- exits ---------------------------------------------------------------------------------------

    def _collect_exits(self) -> None:
        for ex in self.launcher.collect_exits():
            child = self.children.get(ex.pid)
            if child is not None:
                self._on_exit(child, ex)
        if self.launcher.name == "forkserver" and not self.launcher.healthy():
            self._fork_server_died()

    def _fork_server_died(self) -> None:
        log.critical("the fork server died; its children died with it")
        for child in list(self.children.values()):
            child.kill_reason = child.kill_reason or "fork-server-died"
            self._on_exit(child, ChildExit(child.pid, None, signal.SIGKILL, None, None))
        self.launcher.close()
        if self.draining:
            return
        try:
            self.launcher.start(wait=False)  # preloading (torch: seconds) off the loop
            log.warning("fork server restarting (claims resume when it is ready)")
        except Exception as exc:
            log.critical("the fork server cannot be restarted (%s); stopping", _brief(exc))
            self.exit_code = 1
            self._stop_now("fork server lost")

    def _on_exit(self, child: Child, ex: ChildExit) -> None:
        self._pump(child)  # the last messages and output
        self._close_child(child)
        del self.children[child.pid]
        self.next_poll = min(self.next_poll, time.monotonic())  # a slot is free: claim now
        if child.lost:
            log.info("run %s: lost child %d %s", child.short_id, child.pid, ex.describe())
            return
        if child.fenced:
            self.abandoned[child.run.run_id] = (
                child.run, "SelfFenced: the runner could not renew its lease in time and killed the child")
            self.next_heartbeat = min(self.next_heartbeat, time.monotonic())
            return
        oom_after = procinfo.oom_kill_counter() if ex.signal == signal.SIGKILL else None
        if child.kill_reason == "fork-server-died":
            outcome = Outcome(status="FAILED", exit_reason="signal", exit_signal=signal.SIGKILL,
                              error="ForkServerDied: the runner's fork server died and took the child with it")
        else:
            outcome = decide(
                worker=child.run.worker_name, exit=ex, result=child.result, kill_reason=child.kill_reason,
                signals_sent=child.signals_sent,
                stderr_tail=child.tail_text(200 if child.kill_reason == "stalled" else 25),
                oom_kills_before=child.oom_kills_at_start, oom_kills_after=oom_after,
                max_runtime=self.options.max_runtime, cancel_grace=self.options.cancel_grace,
                drain_timeout=self.options.drain_timeout,
            )
        if outcome.progress is None:
            outcome.progress = child.progress
        metrics = outcome.metrics
        if ex.peak_rss_bytes is not None:
            metrics["peak_rss_bytes"] = max(ex.peak_rss_bytes, metrics.get("peak_rss_bytes") or 0)
        if ex.cpu_seconds is not None:
            metrics["cpu_seconds"] = ex.cpu_seconds
        if child.gpu_peak_bytes:
            metrics["gpu_peak_bytes"] = child.gpu_peak_bytes
        if child.device is not None:
            metrics["device"] = child.device.describe()
        if child.ready_at is not None:
            metrics["child_ready_ms"] = round((child.ready_at - child.claimed_at) * 1000, 1)
        metrics["wall_seconds"] = round(time.monotonic() - child.claimed_at, 3)
        metrics["start_method"] = self.launcher.name
        if not outcome.write:
            # The child found its lease gone: the next heartbeat says whether the row is still ours.
            self.abandoned[child.run.run_id] = (child.run, outcome.error or "LeaseLost: the run's lease was lost")
            self.next_heartbeat = min(self.next_heartbeat, time.monotonic())
            return
        log.log(logging.INFO if outcome.status == "SUCCESS" else logging.WARNING,
                "run %s (%s): child %d %s -> %s%s", child.short_id, child.run.worker_name, child.pid,
                ex.describe(), outcome.status, f" ({outcome.error.splitlines()[0]})" if outcome.error else "")
        self._finish(child.run, outcome)

    def _close_child(self, child: Child) -> None:
        try:
            child.channel.close()
        except OSError:
            pass
        if child.output_fd is not None:
            try:
                os.close(child.output_fd)
            except OSError:
                pass
            child.output_fd = None

    def _finish(self, run: WorkerRun, outcome: Outcome) -> None:
        try:
            row = self._db(
                "finish", ledger.finish, run.run_id, self.runner_id, outcome.status,
                error=outcome.error, exit_code=outcome.exit_code, exit_signal=outcome.exit_signal,
                exit_reason=outcome.exit_reason, progress=outcome.progress, metrics=outcome.metrics or None,
                result=outcome.result,
            )
        except DatabaseDown:
            self.pending_finishes.append((run, outcome))
            return
        if row is None:
            self.counters["lost"] += 1
            self.finished[run.run_id] = None
            log.warning("run %s (%s): finish touched no row (the lease was lost; another runner closed it); "
                        "nothing written", run.run_id, run.worker_name)
            return
        self.counters[row.status] = self.counters.get(row.status, 0) + 1
        self.finished[run.run_id] = row

    def _retry_pending(self) -> None:
        if self.db_state != "ok":
            return
        for child in list(self.children.values()):
            if child.resolved is not None:
                self._record_start(child)
        pending, self.pending_finishes = self.pending_finishes, []
        for run, outcome in pending:
            self._finish(run, outcome)

    # --- observation ---------------------------------------------------------------------------------

    def _sample_resources(self) -> None:
        gpu = self.gpu.memory_by_pid() if self.gpu is not None else {}
        for child in self.children.values():
            child.rss_bytes = procinfo.rss_bytes(child.pid)
            if gpu:
                child.gpu_bytes = gpu.get(child.pid)
                if child.gpu_bytes:
                    child.gpu_peak_bytes = max(child.gpu_peak_bytes, child.gpu_bytes)

    def _maybe_watchdog(self) -> None:
        if self.notifier is None or not self.notifier.watchdog_interval:
            return
        now = time.monotonic()
        if now >= self.next_watchdog:
            self.notifier.watchdog()
            self.next_watchdog = now + self.notifier.watchdog_interval

    @property
    def state(self) -> str:
        """running | draining | fenced: what the status, the process title and systemd show."""
        return "draining" if self.draining else ("fenced" if self.fenced else "running")

    def _status_line(self) -> str:
        return f"{self.state}: {len(self.children)}/{self.options.concurrency} busy, database {self.db_state}"

    def _retitle(self) -> None:
        title = f"scrinalia-runner: supervisor {self.registration.name} [{self._status_line()}]"
        if title != self._title:
            self._title = title
            procinfo.set_title(title)

    def _control_request(self, request: dict[str, Any]) -> dict[str, Any]:
        from runner.status import supervisor_status

        command = request.get("command", "status")
        if command == "status":
            self._sample_resources()
            return supervisor_status(self)
        if command == "modules":
            import sys

            from runner.guard import FORBIDDEN

            return {"pid": os.getpid(), "loaded": {name: name in sys.modules for name in FORBIDDEN},
                    "module_count": len(sys.modules)}
        if command == "drain":
            self.begin_drain("drain requested on the control socket")
            return {"draining": True}
        return {"error": f"unknown command {command!r}"}


def _noop_handler(signum: int, frame: Any) -> None:
    """The real work happens in the loop: set_wakeup_fd has already written the signal number."""


def _brief(exc: BaseException) -> str:
    """A one-line description of a database error, without parameters (hide_parameters) or URLs."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first[:300]}"
