"""Open event streams end with their session: logout, deactivation, an expiry moved in the database, a
role or password-change requirement that changed (decision 0141).

A stream is one long answer: the guard checked its session once, when it opened. ``SessionWatch``
keeps that check going for every stream of the process at once: every ``CHECK_SECONDS`` ONE statement
(``sessions.live_standings``) reads which of the streams' sessions are still live and their user's role
now; a stream whose session is gone, or whose standing changed, gets ``session-ended`` and ends, and the
browser's reconnect meets the guard again (a 401, or a stream under the new role). The stream also
compares its own clock with the session's expiry on each event it sends. A database that does not
answer ends no stream (the relay says ``offline`` on its own); the next check that answers decides.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy import Engine

from scrinalia.api.events import Subscriber
from scrinalia.domains.archive.ledger_events import LedgerEvent
from scrinalia.domains.identity.sessions import SessionStanding, live_standings

log = logging.getLogger("scrinalia.api.stream_sessions")

CHECK_SECONDS = 2.0
SESSION_ENDED = LedgerEvent("session-ended")  # the stream's session is no longer what it was opened under


class SessionWatch:
    """The process's streams and the session each was opened under, checked on one timer."""

    def __init__(self, engine: Engine, interval: float = CHECK_SECONDS) -> None:
        self.engine = engine
        self.interval = interval
        self.watched: dict[Subscriber, tuple[int, SessionStanding]] = {}
        self.checks = 0
        self._task: asyncio.Task[None] | None = None

    def watch(self, sub: Subscriber, session_id: int, standing: SessionStanding) -> None:
        self.watched[sub] = (session_id, standing)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scrinalia-stream-sessions")

    def forget(self, sub: Subscriber) -> None:
        self.watched.pop(sub, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def check(self) -> int:
        """One check of every watched stream; returns how many were ended."""
        watched = dict(self.watched)
        if not watched:
            return 0
        try:
            live = await asyncio.to_thread(live_standings, self.engine, [sid for sid, _ in watched.values()])
        except Exception as exc:  # the database is away: nothing is decided now (the class only)
            log.warning("stream sessions not checked (%s); the next check decides", type(exc).__name__)
            return 0
        self.checks += 1
        ended = 0
        for sub, (session_id, standing) in watched.items():
            if live.get(session_id) != standing and sub in self.watched:
                self.forget(sub)
                sub.offer(SESSION_ENDED)
                ended += 1
        return ended

    async def _run(self) -> None:
        while self.watched:
            await asyncio.sleep(self.interval)
            await self.check()
