"""Hear the ledger's notifications without ever blocking the caller's loop.

One LISTEN connection (raw libpq through ``psycopg.pq``, in non-blocking mode) that a loop drives:
the runner's supervisor puts ``fileno()`` in its ``select`` and calls ``step()``; the API's event hub
does the same with asyncio's ``add_reader``. Nothing here waits: connecting is libpq's asynchronous
``connect_start``/``connect_poll``, reading is ``consume_input``/``notifies``. libpq resolves a host
name inside ``connect_start``, synchronously, so a host name (not an address, no ``hostaddr``) is
resolved first on a helper thread and handed to libpq as ``hostaddr`` (``host`` stays, for TLS's name
check): a slow DNS server holds no loop either (decision 0110). A failure closes the
connection and schedules a retry with a backoff (0.5 s doubling to 30 s), so a database that is away
costs the loop nothing.

Every time the LISTEN becomes active (the first time and after each reconnect) ``step`` returns a
``resync`` event: notifications sent while no one listened are gone, so the caller re-reads the truth
(the supervisor polls, the panel refreshes).

A LISTEN that is accepted may still hear nothing: a transaction pooler (PgBouncer in transaction mode)
runs the LISTEN on whichever server session it lends, then lends that session to other clients, and
what it hears is dropped (decision 0123). A listener made with ``probe=True`` does not trust an
accepted LISTEN: it also listens on a channel of its own, its owner sends a NOTIFY there from ANOTHER
connection (``send_probe``, through the owner's engine; a NOTIFY on the listening connection itself
could come back through a pooler's reused session and prove nothing), and only when that comes back is
the listener ``hears`` (and its ``resync`` returned). One that does not come back within
``PROBE_SECONDS`` makes the listener ``deaf``: said once in the log, the connection closed, the owner
polls; it tries again every ``DEAF_RETRY_SECONDS``, quietly.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq.abc import PGconn
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL

from scrinalia import bounded_json
from scrinalia.db.tables import RUN_STATUSES, WORKER_NAME_MAX
from scrinalia.domains.archive.ledger import LEDGER_CHANNEL, LISTEN_STATEMENT

log = logging.getLogger("scrinalia.ledger.events")

RETRY_MIN_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10.0
CONNECT_STEP_SECONDS = 0.02  # while libpq waits to write during the connect (the loop selects on reads only)
MAX_EVENTS_PER_STEP = 1000   # a bounded read: a flood is read over several turns of the loop
PROBE_SECONDS = 5.0          # a NOTIFY to ourselves that has not come back by then never will
PROBE_RETRY_SECONDS = 1.0    # the owner could not send the probe (the database is away): again after this
DEAF_RETRY_SECONDS = 300.0   # a deaf LISTEN is tried again (quietly) after this
#: The probe: one NOTIFY on the listener's own channel, sent through the owner's engine (decision 0123).
PROBE_STATEMENT = text("SELECT pg_notify(:channel, 'probe')")


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    """One notification: ``kind`` is run | runner | resync (resync: re-read, something may be missed)."""

    kind: str
    run_id: uuid.UUID | None = None
    worker: str | None = None
    status: str | None = None
    cancel: bool = False
    runner_id: uuid.UUID | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("run_id", "worker", "status", "runner_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = str(value)
        if self.kind == "run":
            out["cancel"] = self.cancel
        return out


RESYNC = LedgerEvent("resync")


RUN_KEYS = frozenset({"kind", "run_id", "worker", "status", "cancel"})
RUNNER_KEYS = frozenset({"kind", "runner_id"})


#: Every ``EventRefused.reason``: the label values of ``scrinalia_events_dropped_total``, exported at 0 from
#: the first scrape.
DROP_REASONS = ("too_large", "too_deep", "not_json", "unknown_kind", "bad_shape", "bad_uuid", "bad_worker",
                "bad_status", "bad_cancel")


class EventRefused(ValueError):
    """A notification that is not one the ledger's triggers send; ``reason`` is a stable code (the
    label of ``scrinalia_events_dropped_total``): too_large, too_deep, not_json, unknown_kind,
    bad_shape, bad_uuid, bad_worker, bad_status, bad_cancel."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def parse_payload(payload: str | bytes, workers: Collection[str] | None = None) -> LedgerEvent:
    """The trigger's JSON payload -> an event, or ``EventRefused`` saying why not.

    Any database login may ``pg_notify`` on the channel, so the payload is checked against what the
    triggers of migration 0006 send, and nothing else passes: read with the bounded reader (a few
    thousand ``[`` are refused before the JSON decoder sees them), exactly the trigger's keys, ids in
    the canonical UUID form, a status of the enum, ``cancel`` a JSON boolean, and the worker a name of
    ``workers`` (the catalogue; None: any name of the ledger's length). Never raises anything else."""
    try:
        data = bounded_json.loads(payload, max_bytes=bounded_json.EVENT_MAX_BYTES,
                                  max_depth=bounded_json.EVENT_MAX_DEPTH)
    except bounded_json.JsonRefused as exc:
        raise EventRefused(exc.reason, f"the payload {exc.message}") from None
    if not isinstance(data, dict):
        raise EventRefused("bad_shape", "the payload is not a JSON object")
    kind = data.get("kind")
    if kind == "run":
        _same_keys(data, RUN_KEYS)
        return LedgerEvent("run", run_id=_uuid(data["run_id"]), worker=_worker(data["worker"], workers),
                           status=_status(data["status"]), cancel=_cancel(data["cancel"]))
    if kind == "runner":
        _same_keys(data, RUNNER_KEYS)
        return LedgerEvent("runner", runner_id=_uuid(data["runner_id"]))
    raise EventRefused("unknown_kind", "the kind is not run or runner")


def _same_keys(data: dict[str, Any], keys: frozenset[str]) -> None:
    if set(data) != keys:
        raise EventRefused("bad_shape", f"the keys are not {', '.join(sorted(keys))}")


def _uuid(value: Any) -> uuid.UUID:
    """Only the canonical form PostgreSQL writes (no braces, urn: or bare hex), so an id is one string."""
    if not isinstance(value, str) or len(value) != 36:
        raise EventRefused("bad_uuid", "an id is not a UUID")
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        raise EventRefused("bad_uuid", "an id is not a UUID") from None
    if str(parsed) != value.lower():
        raise EventRefused("bad_uuid", "an id is not a UUID in its canonical form")
    return parsed


def _worker(value: Any, workers: Collection[str] | None) -> str:
    if not isinstance(value, str) or not value or len(value) > WORKER_NAME_MAX:
        raise EventRefused("bad_worker", "the worker is not a worker name")
    if workers is not None and value not in workers:
        raise EventRefused("bad_worker", "the worker is not one of the catalogue")
    return value


def _status(value: Any) -> str:
    if value not in RUN_STATUSES:
        raise EventRefused("bad_status", "the status is not a run status")
    return str(value)


def _cancel(value: Any) -> bool:
    if not isinstance(value, bool):
        raise EventRefused("bad_cancel", "cancel is not a boolean")
    return value


def conninfo_for(engine: Engine, *, url: URL | None = None, **extra: Any) -> str:
    """A libpq conninfo string for the engine's database, or for ``url`` (a direct connection for the
    LISTEN, RUNNER_DATABASE_SESSION_URL / DATABASE_SESSION_URL) read by the engine's dialect (with its
    password: never log it)."""
    _, params = engine.dialect.create_connect_args(url if url is not None else engine.url)
    params = {k: v for k, v in params.items() if v is not None and k != "context"}
    params.setdefault("connect_timeout", int(CONNECT_TIMEOUT_SECONDS))
    # A silent network is noticed: TCP keepalives on an otherwise quiet connection.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 30)
    params.setdefault("keepalives_interval", 10)
    params.setdefault("keepalives_count", 3)
    params.update({k: v for k, v in extra.items() if v is not None})
    return make_conninfo("", **params)


class LedgerListener:
    """A LISTEN connection driven by its owner's loop: ``fileno()`` to wait on, ``due_at()`` for the
    next moment ``step()`` must run even if nothing is readable, ``step()`` to advance and read."""

    def __init__(self, conninfo: str, *, name: str = "listener", workers: Collection[str] | None = None,
                 on_drop: Callable[[str], None] | None = None, probe: bool = False, deaf_hint: str = "") -> None:
        self._conninfo = conninfo.encode()
        self.name = name
        self.workers = frozenset(workers) if workers is not None else None
        self.on_drop = on_drop  # called with the reason of each dropped notification (the API's counter)
        self.dropped = 0
        self.probe = probe
        self.probe_channel = f"scrinalia_probe_{uuid.uuid4().hex[:20]}"
        self.deaf_hint = deaf_hint
        self.hearing = "unproven"  # unproven | proven | deaf: what the probe said (always proven without one)
        self._proven = False       # this connection's probe came back
        self._probe_deadline: float | None = None
        self._probe_next = 0.0
        self._pg: PGconn | None = None
        self.state = "down"  # down | resolving | connecting | subscribing | listening
        self._resolving: dict[str, Any] | None = None  # the helper thread's answer box
        self._poll = pq.PollingStatus.WRITING
        self._connect_deadline = 0.0
        self._retry_delay = RETRY_MIN_SECONDS
        self._next_attempt = 0.0
        self.reconnects = 0
        self._more = False
        self.last_error: str | None = None

    @property
    def listening(self) -> bool:
        """The LISTEN is accepted (whether notifications arrive is ``hears``)."""
        return self.state == "listening"

    @property
    def hears(self) -> bool:
        """Notifications arrive: the LISTEN is accepted and (with a probe) the probe came back."""
        return self.listening and (self._proven or not self.probe)

    def probe_wanted(self, now: float | None = None) -> bool:
        """The owner should send ``send_probe(engine, listener.probe_channel)`` now."""
        now = time.monotonic() if now is None else now
        return (self.probe and self.listening and not self._proven and self._probe_deadline is None
                and now >= self._probe_next)

    def probe_sent(self, now: float | None = None) -> None:
        self._probe_deadline = (time.monotonic() if now is None else now) + PROBE_SECONDS

    def probe_failed(self, now: float | None = None) -> None:
        """The probe could not be sent (the owner's database is away): try again shortly."""
        self._probe_next = (time.monotonic() if now is None else now) + PROBE_RETRY_SECONDS

    def fileno(self) -> int | None:
        """The socket to wait on for reading, or None when there is nothing to read."""
        if self._pg is None:
            return None
        if self.state == "connecting" and self._poll != pq.PollingStatus.READING:
            return None
        try:
            return self._pg.socket
        except Exception:
            return None

    def due_at(self) -> float:
        """CLOCK_MONOTONIC moment at which ``step`` must run without a readable socket."""
        if self.state == "down":
            return self._next_attempt
        if self.state == "resolving":
            return time.monotonic() + CONNECT_STEP_SECONDS
        if self.state == "connecting":
            if self._poll == pq.PollingStatus.READING:
                return self._connect_deadline
            return time.monotonic() + CONNECT_STEP_SECONDS
        if self._more:
            return time.monotonic()
        if self.probe and not self._proven:
            return self._probe_deadline if self._probe_deadline is not None else self._probe_next
        return float("inf")

    def step(self, now: float | None = None) -> list[LedgerEvent]:
        """Advance the connection and return what arrived (bounded; never blocks, never raises)."""
        now = time.monotonic() if now is None else now
        try:
            if self.state == "down":
                if now >= self._next_attempt:
                    self._resolve(now)
                return []
            if self.state == "resolving":
                self._resolved(now)
                return []
            if self.state == "connecting":
                return self._connect_step(now)
            events = self._read()
            if self._probe_deadline is not None and not self._proven and now >= self._probe_deadline:
                self._deaf(now)
                return []
            return events
        except Exception as exc:  # psycopg.OperationalError, OSError: the connection is gone
            self._fail(now, exc)
            return []

    def close(self) -> None:
        if self._pg is not None:
            try:
                self._pg.finish()
            except Exception:
                pass
        self._pg = None
        self._resolving = None
        self.state = "down"
        self._proven = False
        self._probe_deadline = None

    # --- internals ---

    def _resolve(self, now: float) -> None:
        """Start the connection: at once for an address or a unix socket, else after the host name
        has been resolved on a helper thread (``_resolved``)."""
        params = conninfo_to_dict(self._conninfo.decode())
        host = str(params.get("host") or "")
        if not host or params.get("hostaddr") or "," in host or host.startswith("/") or _is_address(host):
            self._start(now, self._conninfo)
            return
        box: dict[str, Any] = {"params": params, "deadline": now + CONNECT_TIMEOUT_SECONDS}
        port = int(str(params.get("port") or 5432).split(",")[0])

        def lookup() -> None:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                box["addr"] = str(infos[0][4][0])
            except OSError as exc:
                box["error"] = exc
            box["done"] = True

        threading.Thread(target=lookup, name="listener-dns", daemon=True).start()
        self._resolving = box
        self.state = "resolving"

    def _resolved(self, now: float) -> None:
        box = self._resolving
        assert box is not None
        if not box.get("done"):
            if now > box["deadline"]:
                raise TimeoutError(f"the host name was not resolved within {CONNECT_TIMEOUT_SECONDS:g} s")
            return
        self._resolving = None
        if "error" in box:
            raise ConnectionError(f"the host name does not resolve: {box['error']}")
        self._start(now, make_conninfo("", **{**box["params"], "hostaddr": box["addr"]}).encode())

    def _start(self, now: float, conninfo: bytes) -> None:
        self._pg = pq.PGconn.connect_start(conninfo)
        if self._pg.status == pq.ConnStatus.BAD:
            raise ConnectionError(self._error_message())
        self._pg.nonblocking = 1
        self.state = "connecting"
        self._poll = pq.PollingStatus.WRITING
        self._connect_deadline = now + CONNECT_TIMEOUT_SECONDS

    def _connect_step(self, now: float) -> list[LedgerEvent]:
        assert self._pg is not None
        self._poll = pq.PollingStatus(self._pg.connect_poll())
        if self._poll == pq.PollingStatus.FAILED:
            raise ConnectionError(self._error_message())
        if self._poll == pq.PollingStatus.OK:
            listen = LISTEN_STATEMENT + (f"; LISTEN {self.probe_channel}" if self.probe else "")
            self._pg.send_query(listen.encode())
            self._pg.flush()
            self.state = "subscribing"
            return self._read()
        if now > self._connect_deadline:
            raise TimeoutError(f"no connection within {CONNECT_TIMEOUT_SECONDS:g} s")
        return []

    def _read(self) -> list[LedgerEvent]:
        pg = self._pg
        assert pg is not None
        pg.consume_input()
        events: list[LedgerEvent] = []
        if self.state == "subscribing":
            if pg.is_busy():
                return events
            self._subscribed(pg)
            if not self.probe:
                events.append(RESYNC)
        self._more = False
        self._drain(pg, events)
        if pg.status == pq.ConnStatus.BAD:
            raise ConnectionError(self._error_message())
        return events

    def _drain(self, pg: PGconn, events: list[LedgerEvent]) -> None:
        """The notifications already read off the socket, onto ``events``: at most MAX_EVENTS_PER_STEP,
        the rest left for the next step (``_more``). Our own probe coming back is no event, but the
        first one makes the LISTEN worth something: a resync."""
        while (note := pg.notifies()) is not None:
            if self._is_probe(note.relname):
                if not self._proven:
                    self._heard()
                    events.append(RESYNC)  # only now is the LISTEN worth anything: re-read the truth
                continue
            event = self._parse(note.extra)
            if event is not None:
                events.append(event)
            if len(events) >= MAX_EVENTS_PER_STEP:
                self._more = True  # the rest is already read off the socket: due_at() says "now"
                return

    def _is_probe(self, channel: bytes) -> bool:
        return self.probe and channel.decode("utf-8", errors="replace") == self.probe_channel

    def _parse(self, payload: bytes) -> LedgerEvent | None:
        """One notification as an event, or None: dropped with one log line (and ``on_drop``)."""
        try:
            return parse_payload(payload, self.workers)
        except EventRefused as exc:
            self.dropped += 1
            # What was wrong, never the payload itself (anyone may send it: no markup or noise in the log).
            log.warning("%s: dropped a notification on %s (%d bytes): %s (%s)", self.name, LEDGER_CHANNEL,
                        len(payload), exc.message, exc.reason)
            if self.on_drop is not None:
                self.on_drop(exc.reason)
            return None

    def _subscribed(self, pg: PGconn) -> None:
        """The LISTEN's answer has arrived: listening from now on (or the LISTEN failed)."""
        ok = False
        while (result := pg.get_result()) is not None:
            ok = ok or result.status == pq.ExecStatus.COMMAND_OK
        if not ok:
            raise ConnectionError(f"LISTEN {LEDGER_CHANNEL} failed: {self._error_message()}")
        self.state = "listening"
        self._proven, self._probe_deadline, self._probe_next = False, None, 0.0
        self._retry_delay = RETRY_MIN_SECONDS
        if self.reconnects or self.last_error:
            log.info("%s: listening again on %s", self.name, LEDGER_CHANNEL)
        self.last_error = None

    def _heard(self) -> None:
        if self.hearing == "deaf":
            log.warning("%s: notifications arrive again on %s", self.name, LEDGER_CHANNEL)
        self.hearing = "proven"
        self._proven, self._probe_deadline = True, None

    def _deaf(self, now: float) -> None:
        """The probe did not come back: this LISTEN hears nothing. Said once; polled meanwhile."""
        if self.hearing != "deaf":
            log.warning("%s: notifications do not arrive: a NOTIFY sent to this LISTEN did not come back "
                        "within %g s (a transaction pooler, e.g. PgBouncer in transaction mode, accepts "
                        "LISTEN but drops what it hears); polling instead%s", self.name, PROBE_SECONDS,
                        f". {self.deaf_hint}" if self.deaf_hint else "")
        self.hearing = "deaf"
        self.close()
        self._next_attempt = now + DEAF_RETRY_SECONDS

    def _fail(self, now: float, exc: BaseException) -> None:
        first = self.last_error is None
        self.last_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        if first:
            log.warning("%s: not listening (%s); retrying in %g s, the poll covers meanwhile",
                        self.name, self.last_error, self._retry_delay)
        self.close()
        self.reconnects += 1
        self._next_attempt = now + self._retry_delay
        self._retry_delay = min(RETRY_MAX_SECONDS, self._retry_delay * 2)

    def _error_message(self) -> str:
        if self._pg is None:
            return "no connection"
        msg = self._pg.error_message.decode("utf-8", errors="replace").strip()
        return msg.splitlines()[0] if msg else "connection failed"


def send_probe(engine: Engine, channel: str) -> None:
    """The probe NOTIFY on a listener's own channel, sent on one of ``engine``'s connections (never the
    LISTEN's own: see the module doc). One statement; it writes nothing."""
    from scrinalia.db.engine import one_statement

    with one_statement(engine) as conn:
        conn.execute(PROBE_STATEMENT, {"channel": channel})


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
