"""The phases of the loop that tend the children: what they say, how they end, what falls due.

Each event goes to the child's state machine (``runner.run_state``); the effects it returns are carried
out here (``_apply``): a signal, a cancel message, or the end of the run handed to the finisher.

One channel per child: a run ends when its exit has been reported (by the launcher: the fork server's
report, or the pidfd of a spawned child) AND its channel has reached EOF (or ``EOF_GRACE`` after the
exit, for a channel that a grandchild inherited). The outcome never depends on reading the channel
"one last time" at the moment of the exit: whatever the child sent before it exited is read first.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from runner import outcome, procinfo
from runner.children import Child
from runner.loop_state import SupervisorBase
from runner.run_state import Action, Due, Effect, Timing
from runner.stall import Action as StallAction
from runner.stall import StallWatch, cpu_seconds

log = logging.getLogger("scrinalia.runner")


class Tending(SupervisorBase):
    # --- children: what they say ---------------------------------------------------------------------

    def _phase_children(self) -> None:
        for child in list(self.children.values()):
            self._pump(child)

    def _pump(self, child: Child) -> None:
        """Read the child's messages and output; the channel's EOF is half of its end."""
        try:
            messages = child.read()
        except Exception as exc:  # not our framing: the child is not speaking the protocol any more
            log.error("run %s: unreadable message from child %d (%s); killing it", child.short_id, child.pid,
                      type(exc).__name__)
            child.reader.eof = True
            messages = []
            self._apply(child, child.state.stop(signal.SIGKILL, None, time.monotonic()))
        if messages and child.stall is not None:
            child.stall.heard(time.monotonic())
        for kind, payload in messages:
            self._on_message(child, kind, payload)
        if child.reader.eof and not child.state.channel_closed:
            self._apply(child, child.state.closed())

    def _on_message(self, child: Child, kind: str, payload: dict[str, Any]) -> None:
        if kind == "started":
            child.state.started(float(payload["t"]))
            own = payload.get("stall_timeout")  # the worker's WorkerSpec.stall_timeout, if it declares one
            child.stall = StallWatch(self.options.stall_timeout if own is None else float(own), time.monotonic())
            latency = (float(payload["t"]) - child.claimed_at) * 1000
            log.info("run %s: worker %s running in child %d (%.0f ms after the claim)",
                     child.short_id, child.run.worker_name, child.pid, latency)
        elif kind == "progress":
            child.progress = payload
            if self.services.on_progress is not None:
                self.services.on_progress(child)
        elif kind == "result":
            child.state.reported(payload, time.monotonic())
            if payload.get("progress"):
                child.progress = payload["progress"]

    # --- exits ---------------------------------------------------------------------------------------

    def _phase_exits(self) -> None:
        now = time.monotonic()
        for ex in self.launcher.collect_exits():
            child = self.children.get(ex.pid)
            if child is not None:
                self._pump(child)  # what it sent before it exited is read before its exit counts
                self._apply(child, child.state.exited(ex, now))
        if self.launcher.name == "forkserver" and not self.launcher.healthy():
            self._fork_server_died()

    def _fork_server_died(self) -> None:
        log.critical("the fork server died; its children died with it")
        now = time.monotonic()
        for child in list(self.children.values()):
            self._apply(child, child.state.fork_server_died(child.pid, now))
        self.launcher.close()
        if self.drain.draining:
            return
        try:
            self.launcher.start(wait=False)  # preloading (torch: seconds) off the loop (decision 0112)
            log.warning("fork server restarting (claims resume when it is ready)")
        except Exception as exc:
            log.critical("the fork server cannot be restarted (%s); stopping", exc)
            self.exit_code = 1
            self._stop_now("fork server lost")

    def _ended(self, child: Child, action: Action) -> None:
        """Exit and channel both observed: out of the table, to the finisher."""
        self._pump(child)  # the output's last lines (the outcome's tail)
        child.close()
        del self.children[child.pid]
        self.timers.now_for("poll")  # a slot is free: claim now
        if self.finisher.child_ended(child, action):
            self.timers.now_for("heartbeat")  # an abandoned run: the heartbeat's answer settles it

    # --- effects -------------------------------------------------------------------------------------

    def _apply(self, child: Child, effects: list[Effect]) -> None:
        for effect in effects:
            if effect.action is Action.SIGNAL and effect.signal is not None:
                procinfo.kill_group(child.pid, effect.signal)
            elif effect.action is Action.SEND_CANCEL:
                child.send("cancel")
            elif child.pid in self.children:  # FINISH, ABANDON, FORGET: once
                self._ended(child, effect.action)

    def _request_cancel(self, child: Child, why: str) -> None:
        effects = child.state.request_cancel(time.monotonic())
        if effects:
            log.info("run %s (%s): %s; the worker stops at its next batch boundary (grace %gs)",
                     child.short_id, child.run.worker_name, why, self.options.cancel_grace)
        self._apply(child, effects)

    def _signal(self, child: Child, sig: int, reason: str | None = None) -> None:
        self._apply(child, child.state.stop(sig, reason, time.monotonic()))

    def _lose(self, child: Child, why: str) -> None:
        self.finisher.lost(child.run, f"{why}; killing child {child.pid}")
        self._apply(child, child.state.lose(time.monotonic()))

    # --- deadlines -----------------------------------------------------------------------------------

    def _timing(self) -> Timing:
        opts = self.options
        drain_deadline = self.drain.deadline if self.drain.draining else None
        return Timing(opts.max_runtime, opts.cancel_grace, opts.kill_grace, drain_deadline)

    def _child_deadlines(self, child: Child) -> list[tuple[float, Callable[[], None]]]:
        """What falls due for ``child``, and when (``RunState.deadlines``), each with what to do then:
        ``_timeout`` sleeps until the earliest, ``_phase_deadlines`` does what is due."""
        due = [(at, self._act(child, d)) for at, d in child.state.deadlines(self._timing())]
        state = child.state
        if child.stall is not None and state.alive and state.kill_reason is None and state.result is None:
            stall_at = child.stall.due_at()
            if stall_at is not None:
                due.append((stall_at, lambda: self._check_stall(child)))
        return due

    def _check_stall(self, child: Child) -> None:
        """The child's stall deadline fell due: probe its CPU time, dump its stack, or stop it."""
        assert child.stall is not None
        action = child.stall.check(time.monotonic(), cpu_seconds(child.pid))
        if action is StallAction.DUMP_STACK:
            log.error("run %s (%s): child %d sent nothing and used no CPU for %.0fs (stall timeout %gs); "
                      "dumping its stack, then stopping it", child.short_id, child.run.worker_name, child.pid,
                      child.stall.silent_seconds_at_dump or 0, child.stall.timeout)
            try:
                os.kill(child.pid, signal.SIGUSR1)  # the child only: SIGUSR1 would kill what it started
            except ProcessLookupError:
                pass
        elif action is StallAction.TERMINATE:
            self._signal(child, signal.SIGTERM, outcome.STALLED)

    def _act(self, child: Child, due: Due) -> Callable[[], None]:
        def act() -> None:
            if due.sig is None:
                self._apply(child, child.state.closed())  # EOF_GRACE after its exit: the channel is over
                return
            why = _DEADLINE_LOGS.get(due.reason or "")
            if why is not None:
                log.log(why[0], "run %s (%s): %s; child %d", child.short_id, child.run.worker_name, why[1], child.pid)
            self._signal(child, due.sig, due.reason)

        return act

    def _phase_deadlines(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            for at, act in self._child_deadlines(child):
                if at <= now:
                    act()
                    break  # what it did changes what falls due next: the next tick (at once) decides

    # --- observation ---------------------------------------------------------------------------------

    def _sample_resources(self) -> None:
        gpu = self.services.gpu.memory_by_pid() if self.services.gpu is not None else {}
        for child in self.children.values():
            res = child.resources
            res.rss_bytes = procinfo.rss_bytes(child.pid)
            if gpu:
                res.gpu_bytes = gpu.get(child.pid)
                if res.gpu_bytes:
                    res.gpu_peak_bytes = max(res.gpu_peak_bytes, res.gpu_bytes)


_DEADLINE_LOGS = {
    outcome.TIMEOUT: (logging.ERROR, "over --max-runtime: SIGKILL"),
    outcome.CANCEL_FORCED: (logging.WARNING, "still running after the cancel grace: SIGTERM"),
    outcome.RUNNER_STOPPED: (logging.WARNING, "drain timeout: SIGTERM"),
}
