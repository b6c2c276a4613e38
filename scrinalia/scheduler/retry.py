"""The retry policy (docs/operations.md, "Retry policy") as one statement.

Only SCHEDULE runs are retried; manual (API) and CLI runs never are. A retry is a new row created after
the previous row is terminal: attempt + 1, retry_of = the failed run, the same request, and
not_before = now() + 60 s x 2^(attempt-1) with +-20% jitter, capped at 30 minutes. At most three
attempts. CANCELLED is never retried, nor a failure on configuration (exit_reason ``configuration``: an
unknown worker, a request the resolver refuses, no model where the options say): it would fail the same
way, holding the slot through its backoff. Only a worker's *latest* run is considered, so a run that an
operator already re-ran by hand is not retried behind their back.
"""
from __future__ import annotations

from sqlalchemy import Engine

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import EnqueuedRetry as Retry

__all__ = ["BASE_DELAY_S", "CAP_S", "JITTER", "MAX_ATTEMPTS", "Retry", "retry_failed_scheduled_runs"]

MAX_ATTEMPTS = 3
BASE_DELAY_S = 60
CAP_S = 30 * 60
JITTER = 0.20


def retry_failed_scheduled_runs(engine: Engine) -> list[Retry]:
    """The policy's one statement, ``ledger.enqueue_retries`` (its home is the ledger module, with every
    other INSERT of a run; docs/protocol.md), with this policy's numbers."""
    return ledger.enqueue_retries(engine, max_attempts=MAX_ATTEMPTS, base_delay_s=BASE_DELAY_S, cap_s=CAP_S,
                                  jitter=JITTER)
