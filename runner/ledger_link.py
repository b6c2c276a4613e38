"""The supervisor's side of the ledger: every protocol statement it sends goes through ``LedgerLink.call``.

``ledger`` is the ledger port (``runner.ledger_port.LedgerPort``): ``runner.pg_ledger.PostgresLedger`` in
production, the in-memory ledger in the simulator; callers name the statement they send, e.g.
``db.call("claim", db.ledger.claim_next, runner_id, capabilities, lease)``.

A database error never kills the loop: ``call`` records the failure (``state``: blocked, unreachable or
error, named by ``classify_database_error`` (decision 0103); the error's class for ``status``) and raises
``DatabaseDown``; the caller leaves what it was doing for a later tick.
``statements`` counts what was sent, by protocol step (``status`` shows it).

No step outlives the self-fence point (decision 0110): ``fence_check`` (the supervisor's fence phase)
runs before each step and after a failed one, and the step runs under ``runner.bounded.until`` the
supervisor's ``fence_point``, so a silent network abandons it there at the latest.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from runner.ledger_port import LedgerPort
from scrinalia.db.errors import classify_database_error, describe_database_error

log = logging.getLogger("scrinalia.runner")


class DatabaseDown(Exception):
    """A ledger statement failed; the loop goes on and retries."""


@dataclass(eq=False)
class LedgerLink:
    ledger: LedgerPort
    state: str = "unknown"       # ok | blocked | unreachable | error | unknown (nothing sent yet)
    error: str | None = None     # the last error's class
    statements: dict[str, int] = field(default_factory=dict)
    fence_point: Callable[[], float | None] = lambda: None  # CLOCK_MONOTONIC; None: nothing to fence
    fence_check: Callable[[], None] = lambda: None          # kills the children once the point is reached

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    @property
    def unreachable(self) -> bool:
        return self.state == "unreachable"

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (a method of ``ledger``), one protocol step named ``what``. Raises
        ``DatabaseDown``."""
        self.fence_check()  # no step starts past the fence point with live children
        self.statements[what] = self.statements.get(what, 0) + 1
        try:
            with self.ledger.bounded(self.fence_point()):  # nor outlives it (runner.bounded)
                result = fn(*args, **kwargs)
        except SQLAlchemyError as exc:
            self.fence_check()
            self.failed(what, exc)
            raise DatabaseDown(what) from None
        self.answered(what)
        return result

    def send(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like ``call``, but a failure propagates (the registration at start: a database that does not
        answer then is the daemon's exit code, not a retry)."""
        self.statements[what] = self.statements.get(what, 0) + 1
        with self.ledger.bounded(self.fence_point()):
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
