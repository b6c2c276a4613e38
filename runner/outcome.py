"""How a child's end becomes a terminal row: status, exit fields, and an error that fingerprints.

The first line of ``error`` always looks like ``ExceptionClass: message`` (the ledger's generated
``error_fingerprint`` is computed from it), and stable across occurrences: numbers, pids and paths are
either absent from it or normalised by the fingerprint function. What varies (the stderr tail, the
traceback) comes after the first line.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from runner.launchers import ChildExit, signal_name

from scrinalia.db.tables import ERROR_MAX  # the ledger's limit on a run's error (a CHECK constraint)
from scrinalia.domains.archive.workers.cuda import classify as classify_cuda


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
    write: bool = True  # False: the row is not ours (lease lost): write nothing


def with_tail(head: str, tail: str) -> str:
    """``head`` then the last lines of the child's output, within the ledger's 2000 characters."""
    head = head[:600]
    tail = tail.strip()
    if not tail:
        return head
    sep = "\n--- last lines of the child's output ---\n"
    room = ERROR_MAX - len(head) - len(sep)
    if room <= 0:
        return head
    return head + sep + tail[-room:]


def decide(
    *,
    worker: str,
    exit: ChildExit,
    result: dict[str, Any] | None,
    kill_reason: str | None,
    signals_sent: set[int],
    stderr_tail: str,
    oom_kills_before: int | None,
    oom_kills_after: int | None,
    max_runtime: float | None,
    cancel_grace: float,
    drain_timeout: float,
) -> Outcome:
    """The terminal outcome of one child (see docs/operations.md, "Runner", for the table), with its
    CUDA failure named (``name_cuda_failure``)."""
    out = _decide(
        worker=worker, exit=exit, result=result, kill_reason=kill_reason, signals_sent=signals_sent,
        stderr_tail=stderr_tail, oom_kills_before=oom_kills_before, oom_kills_after=oom_kills_after,
        max_runtime=max_runtime, cancel_grace=cancel_grace, drain_timeout=drain_timeout,
    )
    return name_cuda_failure(out, exit, stderr_tail)


def name_cuda_failure(out: Outcome, exit: ChildExit, stderr_tail: str) -> Outcome:
    """A FAILED run whose error (or, for a child that died without a result, whose output tail) shows a
    CUDA error becomes ``cuda-error`` / ``cuda-oom``, and its error's first line the stable name of that
    failure (the fingerprint groups it across runs, devices and sizes); the original text follows.

    Only runs that failed on their own: a timeout, a cancel or a stop keeps the supervisor's reason, and
    a SIGKILL (``oom`` or ``PossibleOOMKill``: host memory) stays that, even if the output mentions CUDA."""
    if out.status != "FAILED" or out.exit_reason not in ("exception", "signal") or exit.signal == signal.SIGKILL:
        return out  # SIGKILL: someone else's (the OOM killer's, an operator's), never CUDA's
    died = out.exit_reason == "signal" or out.error is None or out.error.startswith("ChildExited:")
    failure = classify_cuda(out.error, stderr_tail if died else None)
    if failure is None:
        return out
    out.exit_reason = failure.exit_reason
    if died:
        how = (f"was killed by {signal_name(exit.signal)}" if exit.signal is not None
               else f"exited with code {exit.exit_code} without a result")
        out.error = with_tail(f"{failure.headline()} (the child {how})", stderr_tail)
    else:
        out.error = f"{failure.headline()}\n{out.error}"[:ERROR_MAX]
    return out


def _decide(
    *,
    worker: str,
    exit: ChildExit,
    result: dict[str, Any] | None,
    kill_reason: str | None,
    signals_sent: set[int],
    stderr_tail: str,
    oom_kills_before: int | None,
    oom_kills_after: int | None,
    max_runtime: float | None,
    cancel_grace: float,
    drain_timeout: float,
) -> Outcome:
    out = Outcome(status="FAILED", exit_code=exit.exit_code, exit_signal=exit.signal)
    if result is not None:
        out.progress = result.get("progress")
        out.metrics.update(result.get("metrics") or {})
    status = result.get("status") if result else None

    # 1. The worker ended its own way and said so: that is the truth, whatever happened next.
    if status == "SUCCESS":
        out.status, out.result = "SUCCESS", result.get("result")
        return out
    if status == "CANCELLED":
        out.status, out.exit_reason, out.result = "CANCELLED", "cancelled", result.get("result")
        return out
    if status == "FAILED":
        out.exit_reason = "configuration" if result.get("reason") == "configuration" else "exception"
        out.error = result.get("error") or "WorkerFailed: the worker failed without an error message"
        out.result = result.get("result")
        return out
    if status == "LEASE_LOST":
        # RunContext.commit found the lease gone: nothing more is written for this run here.
        out.write = False
        out.status, out.exit_reason = "INTERRUPTED", "lease-lost"
        out.error = result.get("error")
        return out

    # 2. The supervisor stopped it, for a reason of its own.
    if kill_reason == "timeout":
        out.exit_reason = "timeout"
        out.error = with_tail(
            f"Timeout: the run exceeded --max-runtime of {max_runtime:g} s and was killed", stderr_tail
        )
        return out
    if kill_reason == "stalled":
        from runner.stall import stalled_error

        out.exit_reason = "stalled"
        out.error = stalled_error(worker, None, stderr_tail, ERROR_MAX)
        return out
    if kill_reason == "cancel-forced":
        out.status, out.exit_reason = "CANCELLED", "cancel-forced"
        out.error = with_tail(
            f"CancelForced: the worker did not stop within {cancel_grace:g} s of the cancel request "
            "and was stopped with SIGTERM/SIGKILL",
            stderr_tail,
        )
        return out
    if kill_reason == "runner-stopped":
        out.status, out.exit_reason = "INTERRUPTED", "runner-stopped"
        out.error = with_tail(
            f"RunnerStopped: the runner was stopped and the run did not finish within the drain timeout "
            f"({drain_timeout:g} s)",
            stderr_tail,
        )
        return out
    if kill_reason == "operator-interrupt":
        out.status, out.exit_reason = "INTERRUPTED", "runner-stopped"
        out.error = "RunnerStopped: interrupted by the operator (second Ctrl-C or SIGTERM to the one-shot runner)"
        return out

    # 3. It died on its own, without a result.
    if exit.signal is not None:
        name = signal_name(exit.signal)
        if exit.signal == signal.SIGKILL and signal.SIGKILL not in signals_sent:
            confirmed = (
                oom_kills_before is not None and oom_kills_after is not None and oom_kills_after > oom_kills_before
            )
            if confirmed:
                out.exit_reason = "oom"
                out.error = with_tail(
                    f"OutOfMemory: worker {worker} was killed by the kernel's OOM killer "
                    "(the cgroup's oom_kill counter increased)",
                    stderr_tail,
                )
            else:
                out.exit_reason = "signal"
                why = (
                    "the cgroup's oom_kill counter did not change"
                    if oom_kills_before is not None and oom_kills_after is not None
                    else "the cgroup's oom_kill counter cannot be read here"
                )
                out.error = with_tail(
                    f"PossibleOOMKill: worker {worker} was killed by SIGKILL that the runner did not send "
                    f"(the kernel's OOM killer is the usual sender; {why})",
                    stderr_tail,
                )
            return out
        out.exit_reason = "signal"
        out.error = with_tail(f"ChildCrashed: worker {worker} was killed by {name}", stderr_tail)
        return out
    out.exit_reason = "exception"
    out.error = with_tail(
        f"ChildExited: worker {worker} exited with code {exit.exit_code} without a result", stderr_tail
    )
    return out
