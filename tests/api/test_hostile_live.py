"""Hostile input against a real API process and a real PostgreSQL (issue: the live surfaces hold).

* A NOTIFY of ``repeat('[', 7000)`` (or forged events: a worker name with markup, a status outside the
  enum, a braced UUID, a 7,800-character name) is dropped, counted in /metrics and logged once; the
  relay's LISTEN connection stays up and the next real event still reaches the stream.
* A body nested 500 deep is a 422, a body over the size bound a 413: nothing written.
* A string where an integer option is declared is refused with the same message by the API's enqueue,
  its schedules and its settings.
* A stream ends within a few seconds of its session's end: logout, deactivation, expiry set in the
  database, role change.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from scrinalia.domains.identity import users
from tests.api.conftest import PASSWORD, add_user
from tests.api.live import LiveApi, live_api

STREAM = "/api/v1/system/events"


@pytest.fixture
def api(database_url: str, engine: Engine) -> Iterator[LiveApi]:
    add_user(engine, "admin@example.org", "ADMIN")
    with live_api(database_url, workers=1) as live:
        yield live


def _token(base: str, email: str) -> dict[str, str]:
    r = httpx.post(f"{base}/api/v1/auth/login", json={"email": email, "password": PASSWORD, "issue_token": True})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


class StreamReader:
    """One SSE stream read on a thread: every (event, data, monotonic time) it delivers, and its end."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.events: list[tuple[str, dict, float]] = []
        self.ended_at: float | None = None
        self.opened = threading.Event()
        self._client = httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(30, read=30))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.opened.wait(20), "the stream did not open"

    def _read(self) -> None:
        event = None
        try:
            with self._client.stream("GET", STREAM) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event:
                        self.events.append((event, json.loads(line[6:]), time.monotonic()))
                        if event == "hello":
                            self.opened.set()
                        event = None
        except httpx.HTTPError:  # closed by the test
            pass
        finally:
            self.ended_at = time.monotonic()
            self.opened.set()

    def kinds(self) -> list[str]:
        return [e for e, _, _ in self.events]

    def wait(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return predicate(self)

    def close(self) -> None:
        self._client.close()


def _notify(engine: Engine, payload: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_notify('scrinalia_ledger', :p)"), {"p": payload})


def _listening(reader: StreamReader) -> bool:
    return any(e == "resync" or (e == "hello" and d.get("listening")) for e, d, _ in reader.events)


def test_deep_nesting_and_forged_events_are_dropped_and_the_relay_keeps_listening(api, engine) -> None:
    headers = _token(api.base, "admin@example.org")
    reader = StreamReader(api.base, headers)
    try:
        assert reader.wait(_listening, 15), reader.events
        run_id = "0190a0b0-0000-7000-8000-000000000001"
        forged = [
            "[" * 7000,                                    # RecursionError in json.loads, before
            '{"kind":"run","run_id":"' + run_id + '","worker":"<img src=x onerror=alert(1)>","status":"PWNED",'
            '"cancel":"yes"}',
            '{"kind":"run","run_id":"' + run_id + '","worker":"alpha","status":"PWNED","cancel":false}',
            '{"kind":"run","run_id":"' + run_id + '","worker":"' + "w" * 7800 + '","status":"QUEUED","cancel":false}',
            '{"kind":"run","run_id":"' + run_id + '","worker":"not-in-catalogue","status":"QUEUED","cancel":false}',
            '{"kind":"run","run_id":"{' + run_id + '}","worker":"alpha","status":"QUEUED","cancel":false}',
            '{"kind":"run","run_id":"' + run_id + '","worker":"alpha","status":"QUEUED","cancel":"yes"}',
            '{"kind":"run","run_id":"' + run_id + '","worker":"alpha","status":"QUEUED","cancel":false,"x":1}',
            '{"kind":"runner","runner_id":"not-a-uuid"}',
            '{"kind":"shutdown"}',
        ]
        for _ in range(3):
            for payload in forged:
                _notify(engine, payload)
        run = ledger.enqueue(engine, "alpha", {}, trigger="SCHEDULE")
        assert reader.wait(lambda r: any(d.get("run_id") == str(run.run_id) for _, d, _ in r.events), 10), \
            reader.events
        kinds = reader.kinds()
        assert "offline" not in kinds, kinds  # the LISTEN connection never dropped
        relayed = [d for e, d, _ in reader.events if e in ("run", "runner")]
        assert relayed == [{"kind": "run", "run_id": str(run.run_id), "worker": "alpha", "status": "QUEUED",
                            "cancel": False}], relayed
    finally:
        reader.close()
    metrics = httpx.get(f"{api.base}/metrics", headers=headers).text
    dropped = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
               for line in metrics.splitlines() if line.startswith("scrinalia_events_dropped_total{")}
    assert dropped == {'reason="too_deep"': 3.0, 'reason="bad_worker"': 9.0, 'reason="bad_status"': 3.0,
                       'reason="bad_uuid"': 6.0, 'reason="bad_cancel"': 3.0, 'reason="bad_shape"': 3.0,
                       'reason="unknown_kind"': 3.0, 'reason="too_large"': 0.0,
                       'reason="not_json"': 0.0}, dropped  # every reason is exported from the start, at 0
    assert api.log().count("dropped a notification") == 3 * len(forged)
    assert "<img" not in api.log()  # the log quotes a bounded, repr'd name; the markup is only counted


def test_a_deeply_nested_or_oversized_body_is_a_4xx_and_writes_nothing(api, engine) -> None:
    headers = _token(api.base, "admin@example.org")
    nested: dict = {}
    for _ in range(500):
        nested = {"a": nested}
    url = f"{api.base}/api/v1/system/workers/alpha/runs"
    r = httpx.post(url, json={"options": nested}, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["fields"] == {"body": "is nested deeper than 32 levels (502)"}
    r = httpx.post(url, content=b"[" * 7000, headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "validation_failed", r.text
    r = httpx.post(url, content=b'{"options": {"x": "' + b"a" * (2 * 1024 * 1024) + b'"}}',
                   headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large", r.text
    # Unauthenticated and nested: refused before anything reads it, and still not a 500.
    assert httpx.post(url, json={"options": nested}).status_code == 422
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one() == 0
    assert "RecursionError" not in api.log() and "unhandled" not in api.log()


def test_a_string_for_an_integer_option_is_refused_everywhere_with_one_message(api, engine) -> None:
    headers = _token(api.base, "admin@example.org")
    message = "must be an integer, not a string ('64')"
    with httpx.Client(base_url=api.base, headers=headers) as client:
        r = client.post("/api/v1/system/workers/gpu-probe/runs", json={"options": {"matmul_size": "64"}})
        assert r.status_code == 422 and r.json()["fields"] == {"options.matmul_size": message}, r.text
        r = client.post("/api/v1/system/schedules", json={"worker_name": "gpu-probe", "interval_seconds": 3600,
                                                         "request": {"options": {"matmul_size": "64"}}})
        assert r.status_code == 422 and r.json()["fields"] == {"request.options.matmul_size": message}, r.text
        r = client.put("/api/v1/system/workers/gpu-probe/settings", json={"options": {"repeats": True}})
        assert r.status_code == 422, r.text
        assert r.json()["fields"] == {"options.repeats": "must be an integer, not a boolean"}
        r = client.post("/api/v1/system/workers/gpu-probe/runs", json={"options": {"matmul_size": 64.0}})
        assert r.status_code == 422, r.text
        assert r.json()["fields"] == {"options.matmul_size": "must be an integer, not a number written with "
                                                              "a decimal point"}
        r = client.post("/api/v1/system/workers/gpu-probe/runs", json={"options": {"matmul_size": 64}})
        assert r.status_code == 201, r.text
        assert r.json()["request"] == {"options": {"matmul_size": 64}}
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT request FROM archive_worker_runs")).scalars().all()
        assert stored == [{"options": {"matmul_size": 64}}]
        assert conn.execute(text("SELECT count(*) FROM archive_worker_schedules")).scalar_one() == 0


def test_a_stream_ends_within_seconds_of_its_sessions_end(api, engine) -> None:
    emails = {how: f"{how}@example.org" for how in ("logout", "deactivated", "expired", "demoted")}
    for email in emails.values():
        add_user(engine, email, "ADMIN")
    tokens = {how: _token(api.base, email) for how, email in emails.items()}
    readers = {how: StreamReader(api.base, tokens[how]) for how in emails}
    keeper = StreamReader(api.base, _token(api.base, "admin@example.org"))  # its session stays: so does it
    try:
        ended = time.monotonic()
        assert httpx.post(f"{api.base}/api/v1/auth/logout", headers=tokens["logout"]).status_code == 204
        users.deactivate(engine, emails["deactivated"])
        with engine.begin() as conn:
            conn.execute(text("UPDATE auth_sessions s SET expires_at = now() FROM auth_users u "
                              "WHERE u.id = s.user_id AND u.email = :e"), {"e": emails["expired"]})
        users.set_role(engine, emails["demoted"], "VIEWER")
        for how, reader in readers.items():
            assert reader.wait(lambda r: r.ended_at is not None, 6), f"{how}: the stream went on: {reader.kinds()}"
            assert reader.kinds()[-1] == "session-ended", (how, reader.kinds())
            assert reader.ended_at is not None and reader.ended_at - ended < 5.0, (how, reader.ended_at - ended)
        assert keeper.ended_at is None and keeper.kinds()[-1] in ("heartbeat", "hello", "resync"), keeper.kinds()
        # The reconnect meets the guard: gone sessions are refused, the demoted one streams as a VIEWER.
        for how in ("logout", "deactivated", "expired"):
            assert httpx.get(f"{api.base}{STREAM}", headers=tokens[how]).status_code == 401, how
    finally:
        for reader in (*readers.values(), keeper):
            reader.close()
