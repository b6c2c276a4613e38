"""Pick-up on notification: the supervisor's ear on the ledger's channel (decision 0080).

One more fd in the supervisor's ``select``: a LISTEN connection (``LedgerListener``, non-blocking, it
reconnects by itself with a backoff). When the ledger announces a QUEUED run of a worker this runner
can claim, or when the LISTEN (re)starts and notifications may have been missed, ``read`` says "claim
now" and the loop polls at once. A cancel request on one of its RUNNING runs makes it beat at once (the
heartbeat is what hands the request to the child), instead of at the next heartbeat interval. The poll
stays the truth: a notification that is lost costs at most one poll interval, and the loop never waits on
this connection.

The LISTEN connects to ``RUNNER_DATABASE_SESSION_URL`` (else ``DATABASE_SESSION_URL``) when one is set:
a direct connection past a transaction pooler. Otherwise it uses the runner's URL and proves that
notifications arrive (a NOTIFY to its own channel, sent through the supervisor's engine); until they do,
and for good when they do not (``deaf``: said once in the log and in ``status``), the loop claims every
``--poll`` (decision 0123).

Off with ``--no-listen`` or ``SCRINALIA_RUNNER_LISTEN=0``.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from runner import bounded
from scrinalia.domains.archive.ledger_events import LedgerEvent, LedgerListener, conninfo_for, send_probe

LISTEN_ENV = "SCRINALIA_RUNNER_LISTEN"
#: The probe's NOTIFY is clipped to this (connect included): it is sent from the loop, which must stay
#: near its fence point; a probe that cannot be sent in time is sent again a second later.
PROBE_SEND_SECONDS = 0.5
DEAF_HINT = ("Give the runner a direct connection for its LISTEN: RUNNER_DATABASE_SESSION_URL "
             "(or DATABASE_SESSION_URL), past the pooler")


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

    def __init__(self, listener: LedgerListener, capabilities: Iterable[str], engine: Engine | None = None) -> None:
        """``engine``: where the probe is sent from (the supervisor's), for a listener with a probe."""
        self.listener = listener
        self.capabilities = frozenset(capabilities)
        self.engine = engine
        self.wakeups = 0

    @classmethod
    def for_engine(cls, engine: Engine, capabilities: Iterable[str], *, url: URL | None = None,
                   **connect_args: object) -> Wakeup:
        """The LISTEN on ``url`` (a direct connection) or on the engine's database; either way its
        notifications are proven to arrive before the loop relies on them."""
        conninfo = conninfo_for(engine, url=url, **{"application_name": "scrinalia-runner-listen", **connect_args})
        return cls(LedgerListener(conninfo, name="runner wakeup", probe=True, deaf_hint=DEAF_HINT),
                   capabilities, engine)

    @property
    def listening(self) -> bool:
        """Notifications arrive (the LISTEN is up and its probe came back): the poll is the safety net."""
        return self.listener.hears

    def state(self) -> dict[str, object]:
        """For ``status``: hears | deaf (notifications do not arrive: polling) | connecting | down."""
        listener = self.listener
        if listener.hears:
            state = "hears"
        elif listener.hearing == "deaf":
            state = "deaf"
        else:
            state = "connecting" if listener.state != "down" else "down"
        return {"state": state, "error": listener.last_error, "reconnects": listener.reconnects}

    def fileno(self) -> int | None:
        return self.listener.fileno()

    def due_at(self) -> float:
        return self.listener.due_at()

    def read(self, now: float | None = None) -> WakeupNews:
        """Advance the connection; say whether to claim now and which runs were asked to cancel."""
        now = time.monotonic() if now is None else now
        events = self.listener.step(now)
        if self.engine is not None and self.listener.probe_wanted(now):
            self._probe(now)
        news = WakeupNews(claim=any(self._claimable(event) for event in events), cancelled=_cancelled_runs(events))
        if news.claim:
            self.wakeups += 1
        return news

    def _probe(self, now: float) -> None:
        """Send the listener's probe through the supervisor's engine, bounded (PROBE_SEND_SECONDS)."""
        assert self.engine is not None
        try:
            with bounded.until(self.engine, now + PROBE_SEND_SECONDS):
                send_probe(self.engine, self.listener.probe_channel)
        except SQLAlchemyError:
            self.listener.probe_failed(now)
            return
        self.listener.probe_sent(time.monotonic())

    def _claimable(self, event: LedgerEvent) -> bool:
        """A resync (notifications may have been missed) or a run queued for one of our workers."""
        if event.kind == "resync":
            return True
        return event.kind == "run" and event.status == "QUEUED" and event.worker in self.capabilities

    def close(self) -> None:
        self.listener.close()


def _cancelled_runs(events: Iterable[LedgerEvent]) -> set[uuid.UUID]:
    """The runs that are RUNNING with a cancel request: the supervisor signals their children."""
    return {event.run_id for event in events
            if event.kind == "run" and event.status == "RUNNING" and event.cancel and event.run_id is not None}
