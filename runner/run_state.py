"""The life of one run in the supervisor's table: its phases, and the transitions between them.

Every event the supervisor observes about a child is one method of ``RunState``; each returns the
effects to carry out (``Effect``), and the supervisor carries them out. The state machine decides, the
supervisor acts, and the phase is stored, never derived from a set of flags::

    STARTING --started--> RUNNING --result--> FINISHING
        |                    |                    |
        +------ stop --------+------ stop --------+--> STOPPING   (timeout, cancel-forced, drain, operator)
        +------ lose / fence (from any phase before ENDED) -----> LOST | FENCED   (SIGKILL)

    any phase --exit reported AND channel closed (or EOF_GRACE after the exit)--> ENDED, with ONE of
        FINISH   the finisher decides the outcome and writes it (fenced)
        ABANDON  killed by the self-fence: the next heartbeat says whether the row is still ours
        FORGET   the row is not ours any more: nothing is written

A run exists in the table from the moment its child was started; ``record_start`` was written before
(``Supervisor._begin``). The deadlines of a run (``RunState.deadlines``) are read off the same state, so
the loop's sleep and what it then does can never disagree.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from runner import outcome
from runner.launchers import ChildExit
from runner.timings import EOF_GRACE


class RunPhase(StrEnum):
    STARTING = "starting"    # the child was started; its worker has not said "started" yet
    RUNNING = "running"      # the worker's code runs
    FINISHING = "finishing"  # it sent its result; its exit is awaited
    STOPPING = "stopping"    # the supervisor signalled it for a reason of its own
    LOST = "lost"            # the row is not ours any more: SIGKILLed, nothing more is written
    FENCED = "fenced"        # SIGKILLed by the self-fence: the next heartbeat decides
    ENDED = "ended"          # exit and channel both observed: handed to the finisher


class Action(StrEnum):
    SIGNAL = "signal"        # send ``Effect.signal`` to the child's process group
    SEND_CANCEL = "cancel"   # tell the child to stop at its next batch boundary
    FINISH = "finish"        # decide the outcome and write it (the finisher)
    ABANDON = "abandon"      # the finisher keeps it until the next heartbeat says whether it is held
    FORGET = "forget"        # nothing is written


@dataclass(frozen=True, slots=True)
class Effect:
    action: Action
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class Due:
    """A deadline of one run: at its moment, ``stop(sig, reason)``; ``sig`` None: stop waiting for the
    channel's EOF after the exit (``closed``)."""

    sig: int | None
    reason: str | None


@dataclass(slots=True)
class Timing:
    """What the deadlines read: the options, and the drain's deadline (None: not draining)."""

    max_runtime: float | None
    cancel_grace: float
    kill_grace: float
    drain_deadline: float | None = None


@dataclass(eq=False)
class RunState:
    """One run's phase and everything its outcome and deadlines are decided from."""

    claimed_at: float                          # CLOCK_MONOTONIC, just after the claim returned
    phase: RunPhase = RunPhase.STARTING
    ready_at: float | None = None              # the worker's code started (the child's CLOCK_MONOTONIC)
    result: dict[str, Any] | None = None       # what the child reported, once
    result_at: float | None = None
    cancel_sent_at: float | None = None
    kill_reason: str | None = None             # outcome.TIMEOUT, CANCEL_FORCED, RUNNER_STOPPED, ...
    signals_sent: set[int] = field(default_factory=set)
    term_sent_at: float | None = None
    exit: ChildExit | None = None              # the exit report (the launcher's)
    exit_at: float | None = None
    channel_closed: bool = False

    # --- what the child says -----------------------------------------------------------------------

    def started(self, ready_at: float) -> list[Effect]:
        self.ready_at = ready_at
        if self.phase is RunPhase.STARTING:
            self.phase = RunPhase.RUNNING
        return []

    def reported(self, result: dict[str, Any], now: float) -> list[Effect]:
        if self.result is None:
            self.result, self.result_at = result, now
            if self.phase in (RunPhase.STARTING, RunPhase.RUNNING):
                self.phase = RunPhase.FINISHING
        return []

    # --- what the supervisor decides ---------------------------------------------------------------

    def request_cancel(self, now: float) -> list[Effect]:
        if self.cancel_sent_at is not None or not self.alive:
            return []
        self.cancel_sent_at = now
        return [Effect(Action.SEND_CANCEL)]

    def stop(self, sig: int, reason: str | None, now: float) -> list[Effect]:
        """Signal the child (``reason``: the supervisor's, kept for the outcome; the first one wins)."""
        if self.phase is RunPhase.ENDED:
            return []
        if reason is not None and self.kill_reason is None:
            self.kill_reason = reason
        if sig == signal.SIGKILL and sig in self.signals_sent:
            return []
        self.signals_sent.add(sig)
        if sig == signal.SIGTERM:
            self.term_sent_at = now
        if self.phase not in (RunPhase.LOST, RunPhase.FENCED):
            self.phase = RunPhase.STOPPING
        return [Effect(Action.SIGNAL, sig)]

    def lose(self, now: float) -> list[Effect]:
        """The row is not ours any more (the heartbeat did not renew it)."""
        if self.phase in (RunPhase.LOST, RunPhase.ENDED):
            return []
        self.phase = RunPhase.LOST
        return self.stop(signal.SIGKILL, None, now)

    def fence(self, now: float) -> list[Effect]:
        """The lease could not be renewed in time: kill before another runner may expire the row."""
        if not self.alive:
            return []
        self.phase = RunPhase.FENCED
        return self.stop(signal.SIGKILL, None, now)

    def fork_server_died(self, pid: int, now: float) -> list[Effect]:
        """The fork server died and its children with it: their exits will never be reported."""
        if self.kill_reason is None:
            self.kill_reason = outcome.FORK_SERVER_DIED
        return self.exited(ChildExit(pid, None, signal.SIGKILL, None, None), now)

    # --- how the child ends: the exit and the channel's end, in either order ------------------------

    def exited(self, ex: ChildExit, now: float) -> list[Effect]:
        if self.exit is None:
            self.exit, self.exit_at = ex, now
        return self._maybe_ended()

    def closed(self) -> list[Effect]:
        """The child's channel reached EOF (or EOF_GRACE passed after its exit)."""
        self.channel_closed = True
        return self._maybe_ended()

    def _maybe_ended(self) -> list[Effect]:
        if self.exit is None or not self.channel_closed or self.phase is RunPhase.ENDED:
            return []
        ended_as, self.phase = self.phase, RunPhase.ENDED
        if ended_as is RunPhase.LOST:
            return [Effect(Action.FORGET)]
        if ended_as is RunPhase.FENCED:
            return [Effect(Action.ABANDON)]
        return [Effect(Action.FINISH)]

    # --- reading the state -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Its row is ours and it was not killed for that reason (progress and cancels still apply)."""
        return self.phase not in (RunPhase.LOST, RunPhase.FENCED, RunPhase.ENDED)

    @property
    def shown_phase(self) -> str:
        """What ``status`` shows: starting | running | finishing | stopping (lost and fenced children
        were SIGKILLed: they are stopping)."""
        if self.phase in (RunPhase.STARTING, RunPhase.RUNNING, RunPhase.FINISHING):
            return self.phase.value
        return RunPhase.STOPPING.value

    def deadlines(self, timing: Timing) -> list[tuple[float, Due]]:
        """What falls due for this run, and when. One list for both ends, so that the loop never sleeps
        until a moment at which it then does nothing (a deadline in the past would spin it)."""
        due: list[tuple[float, Due]] = []
        if self.exit_at is not None and not self.channel_closed:
            due.append((self.exit_at + EOF_GRACE, Due(None, None)))  # stop waiting for the channel's EOF
        if self.phase in (RunPhase.LOST, RunPhase.FENCED, RunPhase.ENDED):
            return due  # SIGKILLed already: only its exit (and its channel's end) is awaited
        if self.kill_reason is None and self.result is None:
            due.extend(self._stop_deadlines(timing))
        if signal.SIGKILL not in self.signals_sent and self.exit is None:
            # SIGTERM was not enough; or the child sent its result but does not exit.
            due.extend((since + timing.kill_grace, Due(signal.SIGKILL, None))
                       for since in (self.term_sent_at, self.result_at) if since is not None)
        return due

    def _stop_deadlines(self, timing: Timing) -> list[tuple[float, Due]]:
        """The supervisor's reasons to stop a child that is still working."""
        due: list[tuple[float, Due]] = []
        if timing.max_runtime:
            due.append((self.claimed_at + timing.max_runtime, Due(signal.SIGKILL, outcome.TIMEOUT)))
        if self.cancel_sent_at is not None:
            due.append((self.cancel_sent_at + timing.cancel_grace, Due(signal.SIGTERM, outcome.CANCEL_FORCED)))
        if timing.drain_deadline is not None:
            due.append((timing.drain_deadline, Due(signal.SIGTERM, outcome.RUNNER_STOPPED)))
        return due
