"""The finisher: ONE place where the parent decides and writes a run's terminal outcome.

Every end the supervisor observes comes here, and only here is ``ledger.finish`` called:

* a child that ended (its exit reported AND its channel closed: ``RunState``'s FINISH): ``decide``
  (``runner.outcome``) reads what its state machine recorded, the metrics are added, and ``finish``
  writes it, fenced; the fork server's death is one of the reasons ``decide`` knows;
* a claimed run that does not resolve (FAILED ``configuration``), or whose child cannot be started
  (FAILED ``exception``, ``ChildStartFailed``);
* the abandoned runs: a child killed by the self-fence (ABANDON), or one whose ``RunContext.commit``
  found the lease gone (``lease_lost``); the next heartbeat's answer settles them (``settle``):
  still held -> INTERRUPTED ``lease-lost``; not held -> nothing (whoever expired the row closed it).

A ``finish`` that the database did not take waits in ``pending`` and is retried on a later tick. The
two ends that SQL decides (``expire_leases``, ``request_cancel`` of a QUEUED run) use the same
vocabulary (``scrinalia.db.tables.ExitReason``).
"""
from __future__ import annotations

import logging
import signal
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runner.ledger_link import DatabaseDown, LedgerLink, brief
from runner.outcome import STALLED, Outcome, decide, fit_error
from runner.ports import Clock, Processes
from runner.run_state import Action
from scrinalia.db.tables import ExitReason
from scrinalia.domains.archive.ledger import FinishParams, WorkerRun
from scrinalia.journal import run_fields

if TYPE_CHECKING:
    from runner.children import Child
    from runner.timings import Timings

log = logging.getLogger("scrinalia.runner")

SELF_FENCED = "SelfFenced: the runner could not renew its lease in time and killed the child"
LEASE_LOST = "LeaseLost: the run's lease was lost"
#: How many finished rows ``Finisher.finished`` keeps (the newest): the one-shot CLI reads its run's back;
#: a daemon serves runs for days, and a row per finished run kept forever grew the supervisor by ~3.4 MB
#: per 1,000 runs (decision 0380).
FINISHED_KEPT = 8


class Finisher:
    """Also phase ``finishes``: the writes the database did not take, retried while it answers."""

    name = "finishes"

    def __init__(self, clock: Clock, db: LedgerLink, runner_id: uuid.UUID, timings: Timings, start_method: str,
                 processes: Processes) -> None:
        self.clock = clock
        self.db = db
        self.runner_id = runner_id
        self.timings = timings
        self.start_method = start_method
        self.processes = processes
        self.pending: list[tuple[WorkerRun, Outcome]] = []
        self.abandoned: dict[uuid.UUID, tuple[WorkerRun, str]] = {}
        self.finished: dict[uuid.UUID, WorkerRun | None] = {}  # the newest FINISHED_KEPT, oldest first
        self.counters = {k: 0 for k in ("claimed", "SUCCESS", "FAILED", "CANCELLED", "INTERRUPTED", "lost")}

    @property
    def settled(self) -> bool:
        """Nothing left to write or to settle."""
        return not self.pending and not self.abandoned

    # --- the ends ------------------------------------------------------------------------------------

    def child_ended(self, child: Child, action: Action) -> bool:
        """A child's exit and its channel's end were both observed. True: a run was abandoned (the caller
        beats now, so that the heartbeat's answer settles it)."""
        ex = child.state.exit
        assert ex is not None
        if action is Action.FORGET:
            log.info("run %s: lost child %d %s", child.short_id, child.pid, ex.describe(), extra=run_fields(child.run))
            return False
        if action is Action.ABANDON:
            self.abandoned[child.run.run_id] = (child.run, SELF_FENCED)
            return True
        outcome = self.decide(child)
        if not outcome.write:
            self.abandoned[child.run.run_id] = (child.run, outcome.error or LEASE_LOST)
            return True
        log.log(logging.INFO if outcome.status == "SUCCESS" else logging.WARNING,
                "run %s (%s): child %d %s -> %s%s", child.short_id, child.run.worker_name, child.pid,
                ex.describe(), outcome.status, f" ({outcome.error.splitlines()[0]})" if outcome.error else "")
        self.write(child.run, outcome)
        return False

    def decide(self, child: Child) -> Outcome:
        """``outcome.decide`` over what the child's state machine recorded, plus the run's metrics."""
        state, ex = child.state, child.state.exit
        assert ex is not None
        opts = self.timings
        out = decide(
            worker=child.run.worker_name, exit=ex, result=state.result, kill_reason=state.kill_reason,
            signals_sent=state.signals_sent,
            # a stalled child's stack (faulthandler, every thread) is longer than a crash's last lines
            stderr_tail=child.output.tail_text(200 if state.kill_reason == STALLED else 25),
            oom_kills_before=child.resources.oom_kills_at_start,
            oom_kills_after=self.processes.oom_kill_counter() if ex.signal == signal.SIGKILL else None,
            max_runtime=opts.max_runtime, cancel_grace=opts.cancel_grace, drain_timeout=opts.drain_timeout,
        )
        if out.progress is None:
            out.progress = child.progress
        self._add_metrics(out.metrics, child)
        return out

    def _add_metrics(self, metrics: dict[str, Any], child: Child) -> None:
        ex = child.state.exit
        if ex is not None and ex.peak_rss_bytes is not None:
            metrics["peak_rss_bytes"] = max(ex.peak_rss_bytes, metrics.get("peak_rss_bytes") or 0)
        if ex is not None and ex.cpu_seconds is not None:
            metrics["cpu_seconds"] = ex.cpu_seconds
        if child.resources.gpu_peak_bytes:
            metrics["gpu_peak_bytes"] = child.resources.gpu_peak_bytes
        if child.device is not None:
            metrics["device"] = child.device.describe()
        if child.state.ready_at is not None:
            metrics["child_ready_ms"] = round((child.state.ready_at - child.claimed_at) * 1000, 1)
        metrics["wall_seconds"] = round(self.clock.monotonic() - child.claimed_at, 3)
        metrics["start_method"] = self.start_method

    def configuration_failed(self, run: WorkerRun, error: str) -> None:
        """The claimed run's request does not resolve here: FAILED ``configuration``, never retried."""
        log.error("run %s (%s): %s", run.run_id, run.worker_name, error.splitlines()[0], extra=run_fields(run))
        self.write(run, Outcome(status="FAILED", exit_reason=ExitReason.CONFIGURATION, error=error))

    def start_failed(self, run: WorkerRun, exc: BaseException) -> None:
        log.error("run %s (%s): could not start a child: %s", run.run_id, run.worker_name, brief(exc),
                  extra=run_fields(run))
        self.write(run, Outcome(status="FAILED", exit_reason=ExitReason.EXCEPTION,
                                error=fit_error(f"ChildStartFailed: {type(exc).__name__}: {exc}")))

    def not_started(self, run: WorkerRun, why: str) -> None:
        """A claimed run whose child the launcher never started, and the runner stops: INTERRUPTED
        ``runner-stopped`` (no worker code ran; a scheduled run is retried, decision 0136)."""
        log.warning("run %s (%s): %s -> INTERRUPTED", run.run_id, run.worker_name, why, extra=run_fields(run))
        self.write(run, Outcome(status="INTERRUPTED", exit_reason=ExitReason.RUNNER_STOPPED,
                                error=fit_error(f"NotStarted: {why}; no worker code ran")))

    def lost(self, run: WorkerRun, why: str) -> None:
        """A run that is not ours any more: counted, nothing written."""
        self.counters["lost"] += 1
        log.error("run %s (%s) lost: %s; nothing more is written for it", run.run_id, run.worker_name, why,
                  extra=run_fields(run))

    def settle(self, held: Mapping[uuid.UUID, Any]) -> None:
        """The heartbeat's answer (the rows it renewed) settles the abandoned runs."""
        for run_id, (run, error) in list(self.abandoned.items()):
            del self.abandoned[run_id]
            if run_id in held:
                log.warning("run %s (%s): still held after its child was stopped -> INTERRUPTED lease-lost",
                            run_id, run.worker_name, extra=run_fields(run))
                self.write(run, Outcome(status="INTERRUPTED", exit_reason=ExitReason.LEASE_LOST, error=error))
            else:
                self.counters["lost"] += 1
                log.warning("run %s (%s) lost: not held any more (expired, or taken by another runner); "
                            "nothing written", run_id, run.worker_name, extra=run_fields(run))

    def run(self) -> None:
        if self.db.ok:
            self.retry()

    def due(self) -> list[float]:
        return [self.clock.monotonic()] if self.pending and self.db.ok else []

    def retry(self) -> None:
        pending, self.pending = self.pending, []
        for run, outcome in pending:
            self.write(run, outcome)

    # --- the one write -----------------------------------------------------------------------------

    def write(self, run: WorkerRun, outcome: Outcome) -> None:
        """``ledger.finish``, fenced; the database down: pending, retried on a later tick."""
        try:
            row = self.db.call(
                "finish", self.db.ledger.finish, run.run_id, self.runner_id, FinishParams(
                    outcome.status, error=outcome.error, exit_code=outcome.exit_code, exit_signal=outcome.exit_signal,
                    exit_reason=str(outcome.exit_reason) if outcome.exit_reason is not None else None,
                    progress=outcome.progress, metrics=outcome.metrics or None, result=outcome.result),
            )
        except DatabaseDown:
            self.pending.append((run, outcome))
            return
        if row is None:
            self.counters["lost"] += 1
            self._keep(run.run_id, None)
            log.warning("run %s (%s): finish touched no row (the lease was lost; another runner closed it); "
                        "nothing written", run.run_id, run.worker_name, extra=run_fields(run))
            return
        self.counters[row.status] = self.counters.get(row.status, 0) + 1
        self._keep(run.run_id, row)
        # The run's last line: what an operator's `journalctl RUN_ID=<id>` ends on.
        log.log(logging.INFO if row.status in ("SUCCESS", "CANCELLED") else logging.WARNING,
                "run %s (%s) -> %s%s", run.run_id, run.worker_name, row.status,
                f" {outcome.exit_reason}" if outcome.exit_reason is not None else "", extra=run_fields(run))

    def _keep(self, run_id: uuid.UUID, row: WorkerRun | None) -> None:
        """Remember a finished row among the newest ``FINISHED_KEPT`` (the oldest is forgotten)."""
        self.finished.pop(run_id, None)
        self.finished[run_id] = row
        while len(self.finished) > FINISHED_KEPT:
            del self.finished[next(iter(self.finished))]
