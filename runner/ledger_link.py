"""The supervisor's side of the ledger: every protocol statement it sends goes through ``LedgerLink.call``.

``ledger`` is the ledger port (``runner.ledger_port.LedgerPort``): ``runner.pg_ledger.PostgresLedger`` in
production, the in-memory ledger in the simulator; callers name the statement they send, e.g.
``db.call("claim", db.ledger.claim_next, runner_id, capabilities, lease)``.

A database error never kills the loop: ``call`` records the failure (``state``: blocked, unreachable or
error, named by ``classify_database_error`` (decision 0103); the error's class for ``status``) and raises
``DatabaseDown``; the caller leaves what it was doing for a later tick.
``statements`` counts what was sent, by protocol step (``status`` shows it).

No step starts or outlives the self-fence point (decision 0110): ``bound`` (the lease, ``runner.lease``)
says where it is. A step asked for past it is refused (``DatabaseDown``, nothing sent) and a step runs
under ``runner.bounded.until`` it, so a silent network abandons it there at the latest. The link never
fences itself: a step refused, or failed at the point, writes the request ``fence`` (``loop_state.Requests``)
and the loop runs the fence phase before the next phase (decision 0312).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.exc import SQLAlchemyError

from runner.ledger_port import LedgerPort
from runner.loop_state import Requests
from scrinalia.db.errors import classify_database_error, describe_database_error

log = logging.getLogger("scrinalia.runner")


class DatabaseDown(Exception):
    """A ledger statement failed; the loop goes on and retries."""


class FenceBound(Protocol):
    """Where the self-fence point is (``runner.lease.Lease``)."""

    def fence_point(self) -> float | None:
        """CLOCK_MONOTONIC; None: no live child, nothing to fence."""
        ...

    def within_margin(self) -> bool:
        """The lease is within its fence margin (a live child or not): the fence phase is due."""
        ...

    def past_fence_point(self) -> bool:
        """A live child's fence point is reached: nothing may be sent."""
        ...


class Unfenced:
    """No lease (a test of one phase, the registration): nothing bounds a step but its own bound."""

    def fence_point(self) -> float | None:
        return None

    def within_margin(self) -> bool:
        return False

    def past_fence_point(self) -> bool:
        return False


@dataclass(eq=False)
class LedgerLink:
    ledger: LedgerPort
    bound: FenceBound = field(default_factory=Unfenced)
    requests: Requests = field(default_factory=Requests)  # where ``fence`` is asked for (the loop's)
    state: str = "unknown"       # ok | blocked | unreachable | error | unknown (nothing sent yet)
    error: str | None = None     # the last error's class
    statements: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # steps not sent: asked for past the fence point

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    @property
    def unreachable(self) -> bool:
        return self.state == "unreachable"

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (a method of ``ledger``), one protocol step named ``what``. Raises
        ``DatabaseDown``, without sending anything past the fence point."""
        if self.bound.within_margin():
            self.requests.fence = True  # the fence phase runs before the next phase
            if self.bound.past_fence_point():  # no step starts past the fence point with live children
                self.refused[what] = self.refused.get(what, 0) + 1
                raise DatabaseDown(what)
        self.statements[what] = self.statements.get(what, 0) + 1
        try:
            with self.ledger.bounded(self.bound.fence_point()):  # nor outlives it (runner.bounded)
                result = fn(*args, **kwargs)
        except SQLAlchemyError as exc:
            self.failed(what, exc)
            if self.bound.within_margin():  # abandoned at the fence point: fence before the next phase
                self.requests.fence = True
            raise DatabaseDown(what) from None
        self.answered(what)
        return result

    def send(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like ``call``, but a failure propagates (the registration at start: a database that does not
        answer then is the daemon's exit code, not a retry)."""
        self.statements[what] = self.statements.get(what, 0) + 1
        with self.ledger.bounded(self.bound.fence_point()):
            result = fn(*args, **kwargs)
        self.answered(what)
        return result

    def failed(self, what: str, exc: SQLAlchemyError) -> None:
        state = classify_database_error(exc)  # blocked | unreachable | error (decision 0103)
        if self.state != state:
            log.error("database %s: %s failed: %s", state, what, brief(exc))
        self.state = state
        self.error = type(getattr(exc, "orig", None) or exc).__name__

    def answered(self, what: str) -> None:
        if self.state not in ("ok", "unknown"):
            log.warning("database: answers again (%s)", what)
        self.state, self.error = "ok", None


#: A one-line description of a database error, without parameters or secrets (one formatter for all).
brief = describe_database_error
