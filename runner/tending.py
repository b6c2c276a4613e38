"""The phases that tend the children: what they say, how they end, what falls due.

Each event goes to the child's state machine (``runner.run_state``); the effects it returns are carried
out by ``Effects``: a signal, a cancel message, or the end of the run handed to the finisher. Three
phases of the loop read the children (``ChildMessages``, ``Exits``, ``Deadlines``); each receives the
table of children and ``Effects`` explicitly.

One channel per child: a run ends when its exit has been reported (by the launcher: the fork server's
report, or the pidfd of a spawned child) AND its channel has reached EOF (or ``EOF_GRACE`` after the
exit, for a channel that a grandchild inherited). The outcome never depends on reading the channel
"one last time" at the moment of the exit: whatever the child sent before it exited is read first.
"""
from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from runner import outcome
from runner.children import Child
from runner.drain import Drain
from runner.finisher import Finisher
from runner.launchers import Launcher
from runner.loop_state import Requests
from runner.ports import Clock, Processes
from runner.run_state import Action, Due, Effect, Timing
from runner.stall import StallStep, StallWatch
from runner.timings import Timings
from scrinalia.journal import run_fields

log = logging.getLogger("scrinalia.runner")

Children = dict[int, Child]  # the supervisor's table, by pid


class Effects:
    """Carries out what the state machines decide; a child whose exit and channel were both observed
    leaves the table for the finisher."""

    def __init__(self, clock: Clock, children: Children, processes: Processes, finisher: Finisher,
                 timings: Timings, conversation: Conversation, requests: Requests) -> None:
        self.clock = clock
        self.children = children
        self.processes = processes
        self.finisher = finisher
        self.timings = timings
        self.conversation = conversation
        self.requests = requests

    def apply(self, child: Child, effects: list[Effect]) -> None:
        for effect in effects:
            if effect.action is Action.SIGNAL and effect.signal is not None:
                self.processes.signal_group(child.pid, effect.signal)
            elif effect.action is Action.SEND_CANCEL:
                child.send("cancel")
            elif child.pid in self.children:  # FINISH, ABANDON, FORGET: once
                self._ended(child, effect.action)

    def _ended(self, child: Child, action: Action) -> None:
        """Exit and channel both observed: out of the table, to the finisher."""
        self.conversation.read(child, self)  # the output's last lines (the outcome's tail)
        child.close()
        del self.children[child.pid]
        self.requests.claim = True  # a slot is free
        if self.finisher.child_ended(child, action):
            self.requests.beat = True  # an abandoned run: the heartbeat's answer settles it

    def request_cancel(self, child: Child, why: str) -> None:
        effects = child.state.request_cancel(self.clock.monotonic())
        if effects:
            log.info("run %s (%s): %s; the worker stops at its next batch boundary (grace %gs)",
                     child.short_id, child.run.worker_name, why, self.timings.cancel_grace, extra=run_fields(child.run))
        self.apply(child, effects)

    def signal(self, child: Child, sig: int, reason: str | None = None) -> None:
        self.apply(child, child.state.stop(sig, reason, self.clock.monotonic()))

    def lose(self, child: Child, why: str) -> None:
        self.finisher.lost(child.run, f"{why}; killing child {child.pid}")
        self.apply(child, child.state.lose(self.clock.monotonic()))

    def fence(self, child: Child) -> None:
        self.apply(child, child.state.fence(self.clock.monotonic()))


OnMessage = Callable[[Child, str, dict[str, Any]], None]


def pump(child: Child, effects: Effects, on_message: OnMessage | None = None) -> None:
    """Read the child's messages and output; the channel's EOF is half of its end."""
    now = effects.clock.monotonic()
    try:
        messages = child.read()
    except Exception as exc:  # not our framing: the child is not speaking the protocol any more
        log.error("run %s: unreadable message from child %d (%s); killing it", child.short_id, child.pid,
                  type(exc).__name__, extra=run_fields(child.run))
        child.reader.eof = True
        messages = []
        effects.apply(child, child.state.stop(signal.SIGKILL, None, now))
    if messages and child.stall is not None:
        child.stall.heard(now)
    if on_message is not None:
        for kind, payload in messages:
            on_message(child, kind, payload)
    if child.reader.eof and not child.state.channel_closed:
        effects.apply(child, child.state.closed())


class Conversation:
    """What a child says (``started``, ``progress``, ``result``), applied to its state. Not a phase: the
    ``children`` and ``exits`` phases and a run's end (``Effects``) each read a child through it, so what a
    child sent before it exited is read before its exit counts."""

    def __init__(self, clock: Clock, timings: Timings, on_progress: Callable[[Child], None] | None) -> None:
        self.clock = clock
        self.timings = timings
        self.on_progress = on_progress

    def read(self, child: Child, effects: Effects) -> None:
        pump(child, effects, self._on_message)

    def _on_message(self, child: Child, kind: str, payload: dict[str, Any]) -> None:
        now = self.clock.monotonic()
        if kind == "started":
            child.state.started(float(payload["t"]))
            own = payload.get("stall_timeout")  # the worker's WorkerSpec.stall_timeout, if it declares one
            child.stall = StallWatch(self.timings.stall_timeout if own is None else float(own), now)
            latency = (float(payload["t"]) - child.claimed_at) * 1000
            log.info("run %s: worker %s running in child %d (%.0f ms after the claim)",
                     child.short_id, child.run.worker_name, child.pid, latency, extra=run_fields(child.run))
        elif kind == "progress":
            child.progress = payload
            if self.on_progress is not None:
                self.on_progress(child)
        elif kind == "result":
            child.state.reported(payload, now)
            if payload.get("progress"):
                child.progress = payload["progress"]


class ChildMessages:
    """Phase ``children``: each child's channel and output (``started``, ``progress``, ``result``)."""

    name = "children"

    def __init__(self, children: Children, effects: Effects) -> None:
        self.children = children
        self.effects = effects

    def run(self) -> None:
        for child in list(self.children.values()):
            self.effects.conversation.read(child, self.effects)

    def due(self) -> list[float]:
        return []


class Exits:
    """Phase ``exits``: the launcher's exit reports; the fork server's death (restarted off the loop)."""

    name = "exits"

    def __init__(self, clock: Clock, children: Children, launcher: Launcher, effects: Effects, drain: Drain) -> None:
        self.clock = clock
        self.children = children
        self.launcher = launcher
        self.effects = effects
        self.drain = drain

    def run(self) -> None:
        now = self.clock.monotonic()
        for ex in self.launcher.collect_exits():
            child = self.children.get(ex.pid)
            if child is not None:
                self.effects.conversation.read(child, self.effects)  # what it sent before it exited counts first
                self._model_loads(child)
                self.effects.apply(child, child.state.exited(ex, now))
        if self.launcher.name == "forkserver" and not self.launcher.healthy():
            self._fork_server_died()

    def due(self) -> list[float]:
        return []

    def _model_loads(self, child: Child) -> None:
        """A model the child loaded cold (its settings named one the fork server does not hold) is asked
        of the fork server, so the next run is warm (decision 0340). The run's row keeps only whether each
        load was warm and how long it took (no server path in a run's metrics)."""
        metrics = (child.state.result or {}).get("metrics")
        if not isinstance(metrics, dict) or not isinstance(metrics.get("model_loads"), list):
            return
        loads = [load for load in metrics.pop("model_loads") if isinstance(load, dict)]
        metrics["model_load"] = [{"warm": bool(load.get("warm")), "seconds": load.get("seconds")} for load in loads]
        for load in loads:
            key = _cold_model(load)
            if key is not None and self.launcher.warm(key, child.run.worker_name):
                log.info("worker %s loaded %s (%s) cold: asked the fork server to keep it warm",
                         child.run.worker_name, key["model_dir"], key["dtype"])

    def _fork_server_died(self) -> None:
        log.critical("the fork server died; its children died with it")
        now = self.clock.monotonic()
        for child in list(self.children.values()):
            self.effects.apply(child, child.state.fork_server_died(child.pid, now))
        self.launcher.close()
        if self.drain.draining:
            return
        try:
            self.launcher.start(wait=False)  # preloading (torch: seconds) off the loop (decision 0112)
            log.warning("fork server restarting (claims resume when it is ready)")
        except Exception as exc:
            log.critical("the fork server cannot be restarted (%s); stopping", exc)
            self.drain.fail("fork server lost")


def _cold_model(load: dict[str, Any]) -> dict[str, str] | None:
    """The model a load read cold (None: it was warm, or the load does not name its model)."""
    if load.get("warm"):
        return None
    try:
        return {k: str(load[k]) for k in ("model_class", "model_dir", "dtype")}
    except KeyError:
        return None


class Deadlines:
    """Phase ``deadlines``: --max-runtime, the cancel grace, the drain timeout, the stall watch
    (``runner.stall``), SIGTERM -> SIGKILL, the EOF grace. What falls due for a child is read off its
    state (``RunState.deadlines``), so the loop's sleep and what it then does never disagree."""

    name = "deadlines"

    def __init__(self, clock: Clock, children: Children, effects: Effects, processes: Processes,
                 timings: Timings, drain: Drain) -> None:
        self.clock = clock
        self.children = children
        self.effects = effects
        self.processes = processes
        self.timings = timings
        self.drain = drain

    def run(self) -> None:
        now = self.clock.monotonic()
        for child in list(self.children.values()):
            for at, act in self.of(child):
                if at <= now:
                    act()
                    break  # what it did changes what falls due next: the next tick (at once) decides

    def due(self) -> list[float]:
        return [at for child in self.children.values() for at, _ in self.of(child)]

    def _timing(self) -> Timing:
        t = self.timings
        return Timing(t.max_runtime, t.cancel_grace, t.kill_grace, self.drain.deadline_if_draining())

    def of(self, child: Child) -> list[tuple[float, Callable[[], None]]]:
        """What falls due for ``child``, and when, each with what to do then."""
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
        action = child.stall.check(self.clock.monotonic(), self.processes.cpu_seconds(child.pid))
        if action is StallStep.DUMP_STACK:
            log.error("run %s (%s): child %d sent nothing and used no CPU for %.0fs (stall timeout %gs); "
                      "dumping its stack, then stopping it", child.short_id, child.run.worker_name, child.pid,
                      child.stall.silent_seconds_at_dump or 0, child.stall.timeout, extra=run_fields(child.run))
            self.processes.signal_one(child.pid, signal.SIGUSR1)  # the child only: not what it started
        elif action is StallStep.TERMINATE:
            self.effects.signal(child, signal.SIGTERM, outcome.STALLED)

    def _act(self, child: Child, due: Due) -> Callable[[], None]:
        def act() -> None:
            if due.sig is None:
                self.effects.apply(child, child.state.closed())  # EOF_GRACE after its exit: the channel is over
                return
            why = _DEADLINE_LOGS.get(due.reason or "")
            if why is not None:
                log.log(why[0], "run %s (%s): %s; child %d", child.short_id, child.run.worker_name, why[1], child.pid)
            self.effects.signal(child, due.sig, due.reason)

        return act


class Sampler:
    """What the supervisor samples of its children: RSS (``/proc``), GPU memory (NVML)."""

    def __init__(self, children: Children, processes: Processes, gpu: Any) -> None:
        self.children = children
        self.processes = processes
        self.gpu = gpu

    def sample(self) -> None:
        gpu = self.gpu.memory_by_pid() if self.gpu is not None else {}
        for child in self.children.values():
            res = child.resources
            res.rss_bytes = self.processes.rss_bytes(child.pid)
            if gpu:
                res.gpu_bytes = gpu.get(child.pid)
                if res.gpu_bytes:
                    res.gpu_peak_bytes = max(res.gpu_peak_bytes, res.gpu_bytes)


_DEADLINE_LOGS = {
    outcome.TIMEOUT: (logging.ERROR, "over --max-runtime: SIGKILL"),
    outcome.CANCEL_FORCED: (logging.WARNING, "still running after the cancel grace: SIGTERM"),
    outcome.RUNNER_STOPPED: (logging.WARNING, "drain timeout: SIGTERM"),
}
