"""The phases of the loop that keep the lease: heartbeat, self-fence, expiry, progress, notifications.

* heartbeat: ONE statement per interval renews the registry row and every RUNNING row of this runner;
  a row missing from its answer is lost (SIGKILL that child, write nothing more), a cancel request in
  it is handed to the child, and the answer settles the finisher's abandoned runs;
* fence: the lease could not be renewed before ``lease - fence_margin``: SIGKILL every child and claim
  nothing until the database answers (the children are dead before another runner may expire them);
* expiry: ``expire_leases`` on its own cadence (every lease/4: faster than the lease, not every poll);
* progress: ONE statement for every child whose progress changed, at most every PROGRESS_INTERVAL.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from runner.ledger_link import DatabaseDown
from runner.loop_state import PROGRESS_INTERVAL, SupervisorBase
from runner.run_state import Phase
from scrinalia.domains.archive import ledger

log = logging.getLogger("scrinalia.runner")


class LeaseKeeping(SupervisorBase):
    # --- heartbeat -----------------------------------------------------------------------------------

    def _lease_margin(self) -> float:
        return self.lease.margin()

    def _phase_heartbeat(self) -> None:
        if time.monotonic() >= self.timers.heartbeat:
            self._heartbeat()

    def _heartbeat(self) -> None:
        sent = time.monotonic()
        self._sample_resources()
        progress, snapshot = self._beat_payload(sent)
        try:
            # An unchanged snapshot (an idle runner's []) is not sent: the row keeps the one it has.
            beat = self.db.call(
                "heartbeat", ledger.heartbeat, self.runner_id, self.options.lease_seconds,
                progress=progress, children=None if snapshot == self.lease.last_children else snapshot,
            )
        except DatabaseDown:
            self.timers.heartbeat = sent + min(1.0, self.options.heartbeat_seconds)
            return
        self._renewed(beat, sent, snapshot)
        if not beat.registry_renewed:
            log.error("the registry row %s is gone; runs stay fenced by runner_id", self.runner_id)
        self._apply_held(beat.held)
        if beat.drain_requested_at is not None and not self.drain.draining:
            self.begin_drain("drain requested in the registry")

    def _beat_payload(self, now: float) -> tuple[dict[uuid.UUID, Any], list[dict[str, Any]]]:
        """The progress of every child whose row is still ours, and the registry's snapshot of them."""
        live = [c for c in self.children.values() if c.state.phase is not Phase.LOST]
        return {c.run.run_id: c.progress for c in live if c.progress}, [c.snapshot(now) for c in live]

    def _renewed(self, beat: Any, sent: float, snapshot: list[dict[str, Any]]) -> None:
        self.lease.last_children = snapshot
        self.timers.heartbeat = sent + self.options.heartbeat_seconds
        self.lease.last_ok = sent
        # Measured from before the statement was sent: conservative by the round trip.
        self.lease.deadline = sent + (beat.lease_expires_at - beat.db_now).total_seconds()
        if self.lease.fenced:
            log.warning("the database answers again: claiming resumes")
            self.lease.fenced = False

    def _apply_held(self, held: dict[uuid.UUID, Any]) -> None:
        """The rows the heartbeat renewed (with their cancel requests): lose the others, hand the
        cancels over, let the finisher settle what it abandoned."""
        for child in list(self.children.values()):
            if not child.state.alive:
                continue
            if child.run.run_id not in held:
                self._lose(child, "its row was not renewed by the heartbeat (expired or taken by another runner)")
            elif held[child.run.run_id] is not None and child.state.cancel_sent_at is None:
                self._request_cancel(child, "cancel requested")
        for run_id, (run, _) in list(self.unstarted.items()):
            if run_id not in held:
                del self.unstarted[run_id]
                self.finisher.lost(run, "its row was not renewed before its child started")
        self.finisher.settle(held)

    # --- the self-fence ------------------------------------------------------------------------------

    def _phase_fence(self) -> None:
        margin = self.lease.margin()
        if margin > self.options.fence_margin:
            return
        live = [c for c in self.children.values() if c.state.alive]
        if not self.lease.fenced and live:
            log.critical(
                "self-fence: the lease could not be renewed in time (%.1fs of margin left); killing %d children "
                "and claiming nothing until the database answers", margin, len(live),
            )
        elif not self.lease.fenced:
            log.warning("the lease could not be renewed in time; claiming nothing until the database answers")
        self.lease.fenced = True
        now = time.monotonic()
        for child in live:
            self._apply(child, child.state.fence(now))

    # --- expiry --------------------------------------------------------------------------------------

    def _expire_leases(self) -> None:
        self.timers.expiry = time.monotonic() + self.options.expiry_seconds
        try:
            expired = self.db.call("expire_leases", ledger.expire_leases)
        except DatabaseDown:
            return
        for run in expired:
            log.warning("run %s (%s) of runner %s: lease expired -> INTERRUPTED", run.run_id,
                        run.worker_name, run.runner_id)

    # --- notifications and progress (decision 0080) ----------------------------------------------

    def _phase_wakeup(self) -> None:
        """A QUEUED run we can claim was announced (or the LISTEN restarted): poll now. A cancel request
        for a child that was not told yet: beat now, the heartbeat's answer hands it over."""
        wakeup = self.services.wakeup
        if wakeup is None or self.mode != "daemon":
            return
        news = wakeup.read()
        if news.claim and self._may_claim():  # busy, draining or fenced: the poll would claim nothing
            self.timers.now_for("poll")
        if any(c.run.run_id in news.cancelled and c.state.cancel_sent_at is None for c in self.children.values()):
            self.timers.now_for("heartbeat")

    def _poll_interval(self) -> float:
        """While the LISTEN is up the poll is only the safety net: --listen-poll, but at most a quarter of
        the lease (the poll also expires other runners' leases, which must not wait much past their end);
        never faster than --poll. Without the LISTEN: --poll."""
        opts, wakeup = self.options, self.services.wakeup
        if wakeup is not None and wakeup.listening:
            return max(opts.poll_seconds, min(opts.listen_poll_seconds, opts.lease_seconds / 4))
        return opts.poll_seconds

    def _progress_to_write(self) -> dict[uuid.UUID, dict[str, Any]]:
        return {c.run.run_id: c.progress for c in self.children.values()
                if c.progress is not None and c.progress != c.progress_written and c.state.alive}

    def _phase_progress(self) -> None:
        """ONE statement for every child whose progress changed, at most every PROGRESS_INTERVAL; separate
        from the heartbeat, whose cadence is the lease's. A failure waits for the next interval."""
        now = time.monotonic()
        if now < self.timers.progress or self.db.unreachable:
            return
        pending = self._progress_to_write()
        if not pending:
            return
        self.timers.progress = now + PROGRESS_INTERVAL
        try:
            self.db.call("record_progress", ledger.record_progress, self.runner_id, pending)
        except DatabaseDown:
            return
        for child in self.children.values():
            if child.run.run_id in pending:
                child.progress_written = pending[child.run.run_id]
