"""/api/v1/system/events: the ledger's changes as one Server-Sent Events stream per browser.

Authenticated like every /system route (the session cookie travels with ``EventSource``; a script may
use its bearer token). The stream carries what the ledger announced, never a row:

    event: run      data: {"kind": "run", "run_id": ..., "worker": ..., "status": ..., "cancel": false}
    event: runner   data: {"kind": "runner", "runner_id": ...}
    event: resync   data: {"kind": "resync"}       (listening (again): re-read, something may have been missed)
    event: offline  data: {"kind": "offline"}      (the API lost its LISTEN: poll until the next resync)

    event: heartbeat      data: {"kind": "heartbeat", "listening": ...}   (every HEARTBEAT_SECONDS)
    event: session-ended  data: {"kind": "session-ended"}   (logout, revoked, expired, role changed: the end)

It opens with ``event: hello`` (``listening`` says whether the hub hears the database now,
``heartbeat_ms`` how often a ``heartbeat`` comes) and a ``retry`` of 2 s. The heartbeat is an event,
not a comment, so the page sees it: a stream silent for longer than two heartbeats is down, whatever
the socket says (a frozen API keeps its connections open). There is no replay: a browser that
reconnects does a full refresh instead, which is what ``hello`` asks for. A stream lasts at most
``API_EVENTS_STREAM_SECONDS`` (300) and never past its session: ``SessionWatch`` checks every open
stream's session every 2 s and ends those whose session was revoked, expired or changed (decision 0141);
the browser's reconnect then meets the guard again.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from scrinalia.api.context import ctx
from scrinalia.api.events import CLOSED
from scrinalia.api.schemas import SYSTEM_ERRORS
from scrinalia.api.security import Principal, system_guard
from scrinalia.api.stream_sessions import SESSION_ENDED
from scrinalia.domains.identity.sessions import SessionStanding

router = APIRouter(tags=["events"])

HEARTBEAT_SECONDS = 3.0  # also keeps proxies from closing an idle stream
RETRY_MS = 2000


def _frame(event: str, data: dict, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@router.get(
    "/events",
    responses={**SYSTEM_ERRORS, 200: {"content": {"text/event-stream": {}},
                                      "description": "Server-Sent Events: run, runner, resync, hello"}},
    summary="The ledger's changes as Server-Sent Events (the live panel)",
)
async def events(request: Request, principal: Principal = Depends(system_guard)) -> StreamingResponse:
    context = ctx(request)
    hub = context.events
    expires_at = principal.session.expires_at
    lifetime = context.api.events_stream_seconds
    seconds_left = (expires_at - datetime.now(UTC)).total_seconds() if expires_at else lifetime
    ends_at = time.monotonic() + max(0.0, min(lifetime, seconds_left))
    expires_by_session = seconds_left <= lifetime

    watch = context.stream_sessions
    standing = SessionStanding(principal.user.role, principal.user.must_change_password)

    async def stream() -> AsyncIterator[str]:
        sub = hub.subscribe()
        watch.watch(sub, principal.session.session_id, standing)
        sequence = 0
        try:
            yield f"retry: {RETRY_MS}\n\n"
            yield _frame("hello", {"kind": "hello", "listening": hub.listening,
                                   "heartbeat_ms": int(HEARTBEAT_SECONDS * 1000)})
            while True:
                left = ends_at - time.monotonic()
                if left <= 0:
                    if expires_by_session:  # the session's own expiry: the page should know why
                        yield _frame(SESSION_ENDED.kind, SESSION_ENDED.to_json())
                    return
                try:
                    event = await asyncio.wait_for(sub.queue.get(), min(HEARTBEAT_SECONDS, left))
                except TimeoutError:
                    yield _frame("heartbeat", {"kind": "heartbeat", "listening": hub.listening})
                    continue
                if event is CLOSED:
                    return
                if event is SESSION_ENDED:
                    yield _frame(event.kind, event.to_json())
                    return
                sequence += 1
                yield _frame(event.kind, event.to_json(), sequence)
        finally:
            watch.forget(sub)
            hub.unsubscribe(sub)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache, no-store", "X-Accel-Buffering": "no"})
