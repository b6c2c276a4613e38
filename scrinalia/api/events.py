"""The live panel's relay: one LISTEN connection per API process, fanned out to every browser's stream.

``EventHub`` owns a ``LedgerListener`` (the same non-blocking connection the runner uses), drives it
from the event loop with ``add_reader``, and offers each notification to every subscriber's bounded
queue. A browser that does not keep up never grows the process: when its queue is full, the queue is
emptied and a single ``resync`` takes its place (the panel then re-reads everything). When the LISTEN
connection is lost the streams get ``offline`` (the panel polls at its fallback pace) and, once it is
back, ``resync``. The connection
is opened with the first subscriber, not at start, so an API that no panel watches listens to nothing.

The LISTEN connects to ``DATABASE_SESSION_URL`` when one is set (a direct connection past a transaction
pooler), else to ``DATABASE_URL``; either way the hub trusts it only once a NOTIFY it sends itself (from
the API's engine, on a thread) has come back. Until then the streams' ``hello`` says ``listening: false``
and the panel polls; when the probe never comes back the hub is ``deaf`` (said once in the log and in
``/healthz``'s ``notifications``) and stays on polling (decision 0123).

Uvicorn waits for open responses before it shuts down, and a stream never ends by itself: the hub
chains the server's SIGTERM/SIGINT handler (``install_shutdown_hook``) and ends every stream first.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from scrinalia.api.metrics import event_dropped
from scrinalia.domains.archive.ledger_events import RESYNC, LedgerEvent, LedgerListener, conninfo_for, send_probe

log = logging.getLogger("scrinalia.api.events")

QUEUE_SIZE = 256
MAX_WAIT_SECONDS = 5.0
CLOSED = LedgerEvent("closed")    # the hub is going away: end the stream (the browser reconnects)
OFFLINE = LedgerEvent("offline")  # the LISTEN connection is lost: the panel polls until the next resync
DEAF_HINT = "Give the API a direct connection for its LISTEN: DATABASE_SESSION_URL, past the pooler"


@dataclass(eq=False)
class Subscriber:
    """One browser's stream: a bounded queue of events."""

    queue: asyncio.Queue[LedgerEvent] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    overflows: int = 0

    def offer(self, event: LedgerEvent) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            # Too far behind: what is queued is stale anyway. One resync replaces it all.
            self.overflows += 1
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC if event is not CLOSED else CLOSED)


class EventHub:
    """The process's single LISTEN connection and its subscribers."""

    def __init__(self, conninfo: str, workers: Collection[str] | None = None, engine: Engine | None = None) -> None:
        """``engine``: where the probe NOTIFY is sent from (None: the LISTEN is trusted as accepted)."""
        # Only events of the triggers' shape, naming a worker of the catalogue, are relayed; the rest is
        # dropped and counted (scrinalia_events_dropped_total): any database login may NOTIFY.
        self.listener = LedgerListener(conninfo, name="api events", workers=workers, on_drop=event_dropped,
                                       probe=engine is not None, deaf_hint=DEAF_HINT)
        self.engine = engine
        self.subscribers: set[Subscriber] = set()
        self.published = 0
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @classmethod
    def for_engine(cls, engine: Engine, workers: Collection[str] | None = None, *, url: URL | None = None,
                   **connect_args: Any) -> EventHub:
        """The LISTEN on ``url`` (DATABASE_SESSION_URL) or the engine's database, probed from the engine."""
        conninfo = conninfo_for(engine, url=url, **{"application_name": "scrinalia-api-events", **connect_args})
        return cls(conninfo, workers, engine)

    @property
    def listening(self) -> bool:
        """Notifications arrive (for a probed LISTEN: its probe came back)."""
        return self.listener.hears

    def notifications(self) -> str:
        """For /healthz: hears | deaf | connecting | idle (no stream is open, nothing listens)."""
        if self.listener.hears:
            return "hears"
        if self.listener.hearing == "deaf":
            return "deaf"
        return "connecting" if self._task is not None and not self._task.done() else "idle"

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        if self._closing:
            sub.offer(CLOSED)
            return sub
        self.subscribers.add(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scrinalia-events")
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def end_streams(self) -> None:
        """Every stream ends now (the server is shutting down); callable from the loop's thread only."""
        self._closing = True
        for sub in list(self.subscribers):
            sub.offer(CLOSED)

    async def close(self) -> None:
        self.end_streams()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.listener.close()

    def install_shutdown_hook(self) -> None:
        """Chain the server's SIGTERM/SIGINT handler: end the streams, then let the server do its part.
        Only in the main thread (where uvicorn runs its loop); elsewhere (a test client) nothing to do."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous = signal.getsignal(sig)
                if not callable(previous):
                    continue

                def handler(signum: int, frame: Any, previous: Any = previous) -> None:
                    loop.call_soon_threadsafe(self.end_streams)
                    previous(signum, frame)

                signal.signal(sig, handler)
            except ValueError:  # not the main thread
                return

    def _publish(self, event: LedgerEvent) -> None:
        self.published += 1
        for sub in list(self.subscribers):
            sub.offer(event)

    async def _run(self) -> None:
        """Drive the listener from the loop: wait for its socket (or its next due moment), step, fan out."""
        loop = asyncio.get_running_loop()
        while not self._closing:
            was_listening = self.listener.listening
            for event in self.listener.step():
                self._publish(event)
            if self.engine is not None and self.listener.probe_wanted():
                await self._probe(self.engine)
            if was_listening and not self.listener.listening:
                self._publish(OFFLINE)
            fd = self.listener.fileno()
            timeout = max(0.0, min(self.listener.due_at() - time.monotonic(), MAX_WAIT_SECONDS))
            if fd is None:
                await asyncio.sleep(timeout)
                continue
            readable = loop.create_future()
            loop.add_reader(fd, _resolve, readable)
            try:
                await asyncio.wait_for(readable, timeout)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)


    async def _probe(self, engine: Engine) -> None:
        """The listener's probe NOTIFY, on a thread (the engine blocks), from one of the API's connections."""
        try:
            await asyncio.to_thread(send_probe, engine, self.listener.probe_channel)
        except SQLAlchemyError:
            self.listener.probe_failed()
            return
        self.listener.probe_sent()


def _resolve(future: asyncio.Future[None]) -> None:
    """The reader's callback: wake the waiter once (a readable socket calls it until it is removed)."""
    if not future.done():
        future.set_result(None)
