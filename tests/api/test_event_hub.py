"""The event hub's bounded queues: a browser that does not keep up costs one ``resync``, not memory."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scrinalia.api.events import CLOSED, QUEUE_SIZE, EventHub, Subscriber
from scrinalia.domains.archive.ledger_events import RESYNC, LedgerEvent


def _run(scenario: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` in a thread of its own: the test process's main thread may already run an event loop
    (the panel's session browser, Playwright's sync API, when pytest-xdist gives a worker both)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, scenario).result()


def test_a_full_queue_is_replaced_by_one_resync() -> None:
    async def scenario() -> tuple[list[LedgerEvent], list[LedgerEvent]]:
        sub = Subscriber()
        events = [LedgerEvent("run", run_id=uuid.uuid4(), worker="w", status="RUNNING") for _ in range(QUEUE_SIZE + 5)]
        for event in events:
            sub.offer(event)
        drained = []
        while not sub.queue.empty():
            drained.append(sub.queue.get_nowait())
        assert sub.overflows == 1
        return drained, events

    drained, events = _run(scenario())
    assert drained[0] == RESYNC
    assert drained[1:] == events[QUEUE_SIZE + 1:]  # what came after the overflow is kept, in order
    assert len(drained) <= QUEUE_SIZE


def test_ending_the_streams_reaches_every_subscriber(engine) -> None:
    async def scenario() -> None:
        hub = EventHub.for_engine(engine)
        first, second = hub.subscribe(), hub.subscribe()
        hub.end_streams()
        assert first.queue.get_nowait() is CLOSED and second.queue.get_nowait() is CLOSED
        late = hub.subscribe()  # a stream that opens during the shutdown ends at once
        assert late.queue.get_nowait() is CLOSED
        await hub.close()

    _run(scenario())


def test_the_stream_opens_with_its_retry_and_hello(client, viewer_headers) -> None:
    # events_stream_seconds=0 here: the stream ends right after its hello (the live test keeps one open).
    r = client.get("/api/v1/system/events", headers=viewer_headers)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"].startswith("no-cache")
    assert r.text.startswith("retry: 2000\n\nevent: hello\ndata: {\"kind\":\"hello\",\"listening\":")
    assert client.get("/api/v1/system/events").status_code == 401
