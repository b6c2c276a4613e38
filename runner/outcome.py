"""How a child's end becomes a terminal row: status, exit fields, and an error that fingerprints.

The first line of ``error`` always looks like ``ExceptionClass: message`` (the ledger's generated
``error_fingerprint`` is computed from it), and stable across occurrences: numbers, pids and paths are
either absent from it or normalised by the fingerprint function. What varies (the stderr tail, the
traceback) comes after the first line. ``fit_error`` is the one place where an error is cut to the
ledger's length; everything that composes an error goes through it.

``decide`` is pure: the finisher (``runner.finisher``) calls it with what the child's state machine
recorded and writes what it returns.
"""
from __future__ import annotations

import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

from runner.launchers import ChildExit, signal_name
from scrinalia.db.tables import ERROR_MAX  # the ledger's limit on a run's error (a CHECK constraint)
from scrinalia.db.tables import ExitReason as R
from scrinalia.domains.archive.workers.cuda import classify as classify_cuda

HEAD_MAX = 600  # the first line: what the fingerprint is computed from
TAIL_SEPARATOR = "\n--- last lines of the child's output ---\n"

# The supervisor's own reasons for stopping a child (``RunState.kill_reason``).
TIMEOUT = "timeout"
CANCEL_FORCED = "cancel-forced"
RUNNER_STOPPED = "runner-stopped"
OPERATOR_INTERRUPT = "operator-interrupt"
FORK_SERVER_DIED = "fork-server-died"
STALLED = "stalled"  # no message and no CPU work for the stall timeout (runner.stall)


@dataclass(slots=True)
class Outcome:
    status: str
    exit_reason: str | None = None
    error: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    result: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    write: bool = True  # False: the row may not be ours (lease lost): the next heartbeat decides


@dataclass(frozen=True, slots=True)
class Limits:
    """The options that the error texts quote."""

    max_runtime: float | None
    cancel_grace: float
    drain_timeout: float


def fit_error(head: str, detail: str = "", sep: str = "\n") -> str:
    """``head`` (its first line, at most HEAD_MAX characters), then ``sep`` and ``detail`` within the
    ledger's ERROR_MAX: all of it when it fits, else its first line and its END (a traceback's last
    frames, an output's last lines). The one place where an error's length is decided."""
    head = (head.strip().splitlines() or [""])[0][:HEAD_MAX]
    detail = detail.strip("\n")
    room = ERROR_MAX - len(head) - len(sep)
    if not detail or room <= 0:
        return head
    if len(detail) <= room:
        return head + sep + detail
    first, _, rest = detail.partition("\n")
    first = first[: min(HEAD_MAX, room)]
    rest_room = room - len(first) - 1
    return head + sep + first + ("\n" + rest[-rest_room:] if rest_room > 0 and rest else "")


def format_error(exc: BaseException) -> str:
    """``ExceptionClass: message`` on the first line (the fingerprint), then the traceback's tail."""
    message = str(exc).strip().splitlines()
    head = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    return fit_error(head, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def with_tail(head: str, tail: str) -> str:
    """``head`` then the last lines of the child's output, within the ledger's 2000 characters."""
    return fit_error(head, tail.strip(), TAIL_SEPARATOR)


def decide(
    *,
    worker: str,
    exit: ChildExit,
    result: dict[str, Any] | None,
    kill_reason: str | None,
    signals_sent: set[int] | frozenset[int],
    stderr_tail: str,
    oom_kills_before: int | None,
    oom_kills_after: int | None,
    max_runtime: float | None,
    cancel_grace: float,
    drain_timeout: float,
) -> Outcome:
    """The terminal outcome of one child (see docs/architecture.md for the table), with its CUDA failure
    named (``name_cuda_failure``). In order: what the worker said, then the supervisor's own reason,
    then how the process died."""
    out = Outcome(status="FAILED", exit_code=exit.exit_code, exit_signal=exit.signal)
    if result is not None:
        out.progress = result.get("progress")
        out.metrics.update(result.get("metrics") or {})
    limits = Limits(max_runtime, cancel_grace, drain_timeout)
    if not (_reported(out, result) or _stopped(out, kill_reason, limits, stderr_tail, worker)):
        _died(out, worker, exit, signals_sent, stderr_tail, (oom_kills_before, oom_kills_after))
    return name_cuda_failure(out, exit, stderr_tail)


def _reported(out: Outcome, result: dict[str, Any] | None) -> bool:
    """1. The worker ended its own way and said so: that is the truth, whatever happened next."""
    if result is None:
        return False
    if result.get("lease_lost"):
        # RunContext.commit found the lease gone: nothing is written here; the next heartbeat decides.
        out.write = False
        out.status, out.exit_reason, out.error = "INTERRUPTED", R.LEASE_LOST, result.get("error")
        return True
    status = result.get("status")
    if status == "SUCCESS":
        out.status, out.result = "SUCCESS", result.get("result")
    elif status == "CANCELLED":
        out.status, out.exit_reason, out.result = "CANCELLED", R.CANCELLED, result.get("result")
    elif status == "FAILED":
        out.exit_reason = R.CONFIGURATION if result.get("reason") == R.CONFIGURATION else R.EXCEPTION
        out.error = result.get("error") or "WorkerFailed: the worker failed without an error message"
        out.result = result.get("result")
    else:
        return False
    return True


def _stopped(out: Outcome, kill_reason: str | None, limits: Limits, tail: str, worker: str = "") -> bool:
    """2. The supervisor stopped it (or lost its fork server), for a reason of its own."""
    if kill_reason == TIMEOUT:
        out.exit_reason = R.TIMEOUT
        out.error = with_tail(f"Timeout: the run exceeded --max-runtime of {limits.max_runtime:g} s and was killed",
                              tail)
    elif kill_reason == CANCEL_FORCED:
        out.status, out.exit_reason = "CANCELLED", R.CANCEL_FORCED
        out.error = with_tail(f"CancelForced: the worker did not stop within {limits.cancel_grace:g} s of the "
                              "cancel request and was stopped with SIGTERM/SIGKILL", tail)
    elif kill_reason == RUNNER_STOPPED:
        out.status, out.exit_reason = "INTERRUPTED", R.RUNNER_STOPPED
        out.error = with_tail("RunnerStopped: the runner was stopped and the run did not finish within the "
                              f"drain timeout ({limits.drain_timeout:g} s)", tail)
    elif kill_reason == OPERATOR_INTERRUPT:
        out.status, out.exit_reason = "INTERRUPTED", R.RUNNER_STOPPED
        out.error = "RunnerStopped: interrupted by the operator (second Ctrl-C or SIGTERM to the one-shot runner)"
    elif kill_reason == STALLED:
        from runner.stall import stalled_error

        out.exit_reason = R.STALLED
        out.error = stalled_error(worker, None, tail, ERROR_MAX)
    elif kill_reason == FORK_SERVER_DIED:
        out.exit_reason, out.exit_code, out.exit_signal = R.SIGNAL, None, signal.SIGKILL
        out.error = "ForkServerDied: the runner's fork server died and took the child with it"
    else:
        return False
    return True


def _died(out: Outcome, worker: str, exit: ChildExit, signals_sent: set[int] | frozenset[int], tail: str,
          oom_kills: tuple[int | None, int | None]) -> None:
    """3. It died on its own, without a result."""
    if exit.signal is None:
        out.exit_reason = R.EXCEPTION
        out.error = with_tail(f"ChildExited: worker {worker} exited with code {exit.exit_code} without a result",
                              tail)
        return
    out.exit_reason = R.SIGNAL
    if exit.signal != signal.SIGKILL or signal.SIGKILL in signals_sent:
        out.error = with_tail(f"ChildCrashed: worker {worker} was killed by {signal_name(exit.signal)}", tail)
        return
    before, after = oom_kills
    if before is not None and after is not None and after > before:
        out.exit_reason = R.OOM
        out.error = with_tail(f"OutOfMemory: worker {worker} was killed by the kernel's OOM killer "
                              "(the cgroup's oom_kill counter increased)", tail)
        return
    why = ("the cgroup's oom_kill counter did not change" if before is not None and after is not None
           else "the cgroup's oom_kill counter cannot be read here")
    out.error = with_tail(f"PossibleOOMKill: worker {worker} was killed by SIGKILL that the runner did not send "
                          f"(the kernel's OOM killer is the usual sender; {why})", tail)


def _failed_on_its_own(out: Outcome, exit: ChildExit) -> bool:
    """FAILED by an exception or a signal, never a SIGKILL (the OOM killer's, an operator's: never CUDA's)."""
    return out.status == "FAILED" and out.exit_reason in (R.EXCEPTION, R.SIGNAL) and exit.signal != signal.SIGKILL


def name_cuda_failure(out: Outcome, exit: ChildExit, stderr_tail: str) -> Outcome:
    """A FAILED run whose error (or, for a child that died without a result, whose output tail) shows a
    CUDA error becomes ``cuda-error`` / ``cuda-oom``, and its error's first line the stable name of that
    failure (the fingerprint groups it across runs, devices and sizes); the original text follows.

    Only runs that failed on their own: a timeout, a cancel or a stop keeps the supervisor's reason, and
    a SIGKILL (``oom`` or ``PossibleOOMKill``: host memory) stays that, even if the output mentions CUDA."""
    if not _failed_on_its_own(out, exit):
        return out
    died = out.exit_reason == R.SIGNAL or out.error is None or out.error.startswith("ChildExited:")
    failure = classify_cuda(out.error, stderr_tail if died else None)
    if failure is None:
        return out
    out.exit_reason = failure.exit_reason
    if died:
        how = (f"was killed by {signal_name(exit.signal)}" if exit.signal is not None
               else f"exited with code {exit.exit_code} without a result")
        out.error = with_tail(f"{failure.headline()} (the child {how})", stderr_tail)
    else:
        out.error = fit_error(failure.headline(), out.error or "")
    return out
