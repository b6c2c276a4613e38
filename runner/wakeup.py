"""Pick-up on notification: the supervisor's ear on the ledger's channel (decision 0080).

One more fd in the supervisor's ``select``: a LISTEN connection (``LedgerListener``, non-blocking, it
reconnects by itself with a backoff). When the ledger announces a QUEUED run of a worker this runner
can claim, or when the LISTEN (re)starts and notifications may have been missed, ``read`` says "claim
now" and the loop polls at once. A cancel request on one of its RUNNING runs makes it beat at once (the
heartbeat is what hands the request to the child), instead of at the next heartbeat interval. The poll
stays the truth: a notification that is lost costs at most one poll interval, and the loop never waits on
this connection.

Off with ``--no-listen`` or ``SCRINALIA_RUNNER_LISTEN=0``.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import Engine

from scrinalia.domains.archive.ledger_events import LedgerEvent, LedgerListener, conninfo_for

LISTEN_ENV = "SCRINALIA_RUNNER_LISTEN"


def listen_default() -> bool:
    """The flag's default: on, unless ``SCRINALIA_RUNNER_LISTEN`` is 0/false/no/off."""
    return os.environ.get(LISTEN_ENV, "1").strip().lower() not in {"0", "false", "no", "off"}


@dataclass(slots=True)
class WakeupNews:
    """What one read of the channel means for the loop."""

    claim: bool = False                                    # a claimable run is QUEUED: poll now
    cancelled: set[uuid.UUID] = field(default_factory=set)  # RUNNING runs with a cancel request


class Wakeup:
    """Turns the ledger's notifications into "claim now" for one supervisor."""

    def __init__(self, listener: LedgerListener, capabilities: Iterable[str]) -> None:
        self.listener = listener
        self.capabilities = frozenset(capabilities)
        self.wakeups = 0

    @classmethod
    def for_engine(cls, engine: Engine, capabilities: Iterable[str], **connect_args: object) -> Wakeup:
        conninfo = conninfo_for(engine, **{"application_name": "scrinalia-runner-listen", **connect_args})
        return cls(LedgerListener(conninfo, name="runner wakeup"), capabilities)

    @property
    def listening(self) -> bool:
        return self.listener.listening

    def fileno(self) -> int | None:
        return self.listener.fileno()

    def due_at(self) -> float:
        return self.listener.due_at()

    def read(self, now: float | None = None) -> WakeupNews:
        """Advance the connection; say whether to claim now and which runs were asked to cancel."""
        news = WakeupNews()
        for event in self.listener.step(time.monotonic() if now is None else now):
            if self._claimable(event):
                news.claim = True
            elif event.kind == "run" and event.status == "RUNNING" and event.cancel and event.run_id is not None:
                news.cancelled.add(event.run_id)
        if news.claim:
            self.wakeups += 1
        return news

    def _claimable(self, event: LedgerEvent) -> bool:
        """A resync (notifications may have been missed) or a run queued for one of our workers."""
        if event.kind == "resync":
            return True
        return event.kind == "run" and event.status == "QUEUED" and event.worker in self.capabilities

    def close(self) -> None:
        self.listener.close()
