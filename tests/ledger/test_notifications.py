"""The ledger announces what an operator can see (migration 0006), and nothing else.

A real LISTEN connection (``LedgerListener``, the one the runner and the API use) against a real
PostgreSQL: every protocol step that changes a visible field notifies once at commit; a heartbeat that
only renews leases, or that writes the same progress and children again, is silent.
"""
from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import FinishParams
from scrinalia.domains.archive.ledger_events import RESYNC, LedgerEvent, LedgerListener, conninfo_for
from tests.ledger.helpers import register_runner


def collect(listener: LedgerListener, until=None, timeout: float = 5.0, quiet: float = 0.0) -> list[LedgerEvent]:
    """Step the listener until ``until(events)`` holds (bounded by ``timeout``), or for ``quiet`` s."""
    import select

    events: list[LedgerEvent] = []
    deadline = time.monotonic() + (quiet or timeout)
    while time.monotonic() < deadline:
        fd = listener.fileno()
        wait = max(0.0, min(deadline, listener.due_at()) - time.monotonic())
        if fd is not None:
            select.select([fd], [], [], min(wait, 0.1))
        else:
            time.sleep(min(wait, 0.02))
        events.extend(listener.step())
        if until is not None and not quiet and until(events):
            return events
    if until is not None and not quiet:
        raise AssertionError(f"condition not reached within {timeout} s; heard {events}")
    return events


@pytest.fixture
def listener(engine: Engine):
    lst = LedgerListener(conninfo_for(engine, application_name="test-listener"), name="test")
    events = collect(lst, lambda ev: RESYNC in ev)
    assert events == [RESYNC]
    yield lst
    lst.close()


def runs_of(events: list[LedgerEvent]) -> list[tuple[str, str | None]]:
    return [(e.worker or "", e.status) for e in events if e.kind == "run"]


def test_every_run_step_is_announced_at_commit(engine: Engine, listener: LedgerListener) -> None:
    runner = register_runner(engine, ["w"])
    collect(listener, lambda ev: any(e.kind == "runner" and e.runner_id == runner for e in ev))

    run = ledger.enqueue(engine, "w", {})
    events = collect(listener, lambda ev: runs_of(ev))
    assert events[0] == LedgerEvent("run", run_id=run.run_id, worker="w", status="QUEUED")

    claimed = ledger.claim_next(engine, runner, ["w"], 60)
    assert claimed is not None
    assert runs_of(collect(listener, lambda ev: runs_of(ev))) == [("w", "RUNNING")]

    assert ledger.record_progress(engine, runner, {run.run_id: {"done": 1, "total": 4}}) == 1
    assert runs_of(collect(listener, lambda ev: runs_of(ev))) == [("w", "RUNNING")]

    ledger.request_cancel(engine, run.run_id, "someone")
    events = collect(listener, lambda ev: runs_of(ev))
    assert runs_of(events) == [("w", "RUNNING")] and events[0].cancel  # the runner beats at once on it

    ledger.finish(engine, run.run_id, runner, FinishParams("CANCELLED", exit_reason="cancelled"))
    assert runs_of(collect(listener, lambda ev: runs_of(ev))) == [("w", "CANCELLED")]

    # An uncommitted change is not announced (NOTIFY is delivered at COMMIT only).
    with engine.connect() as conn:
        with conn.begin() as tx:
            conn.execute(text("INSERT INTO archive_worker_runs (worker_name, status, trigger, request) "
                              "VALUES ('w', 'QUEUED', 'API', '{}')"))
            tx.rollback()
    assert runs_of(collect(listener, quiet=0.5)) == []


def test_a_lease_only_heartbeat_is_silent(engine: Engine, listener: LedgerListener) -> None:
    runner = register_runner(engine, ["w"])
    run = ledger.enqueue(engine, "w", {})
    ledger.claim_next(engine, runner, ["w"], 60)
    progress = {run.run_id: {"done": 2, "total": 4}}
    ledger.heartbeat(engine, runner, 60, progress=progress, children=[{"run_id": str(run.run_id)}])
    collect(listener, lambda ev: any(e.kind == "runner" for e in ev) and runs_of(ev))
    collect(listener, quiet=0.3)  # drain whatever else the setup announced

    # The same progress and the same children again, then no progress and no snapshot at all:
    # only heartbeat_at, lease_expires_at and last_heartbeat_at change. Nothing is announced.
    ledger.heartbeat(engine, runner, 60, progress=progress, children=[{"run_id": str(run.run_id)}])
    ledger.heartbeat(engine, runner, 60)
    assert ledger.record_progress(engine, runner, progress) == 0  # unchanged: not even rewritten
    assert collect(listener, quiet=0.5) == []

    # A drain request and the stop are visible: announced.
    registry.request_drain(engine, runner, "ops")
    collect(listener, lambda ev: [e for e in ev if e.kind == "runner" and e.runner_id == runner])
    registry.stop(engine, runner)
    collect(listener, lambda ev: [e for e in ev if e.kind == "runner" and e.runner_id == runner])


def test_record_progress_is_one_fenced_statement_for_all_children(engine: Engine) -> None:
    me = register_runner(engine, ["a", "b", "c"], name="me")
    other = register_runner(engine, ["c"], name="other")
    run_a = ledger.enqueue(engine, "a", {})
    run_b = ledger.enqueue(engine, "b", {})
    run_c = ledger.enqueue(engine, "c", {})
    ledger.claim_next(engine, me, ["a"], 60)
    ledger.claim_next(engine, me, ["b"], 60)
    ledger.claim_next(engine, other, ["c"], 60)

    changed = ledger.record_progress(engine, me, {
        run_a.run_id: {"done": 1, "total": 2},
        str(run_b.run_id): {"done": 5},
        run_c.run_id: {"done": 99},          # not mine: fenced out
        uuid.uuid4(): {"done": 1},            # no such run: nothing
    })
    assert changed == 2
    assert ledger.get_run(engine, run_a.run_id).progress == {"done": 1, "total": 2}
    assert ledger.get_run(engine, run_b.run_id).progress == {"done": 5}
    assert ledger.get_run(engine, run_c.run_id).progress is None

    ledger.finish(engine, run_a.run_id, me, FinishParams("SUCCESS"))
    assert ledger.record_progress(engine, me, {run_a.run_id: {"done": 2, "total": 2}}) == 0  # not RUNNING
    assert ledger.record_progress(engine, me, {}) == 0


def test_the_listener_comes_back_after_its_connection_is_killed(engine: Engine, listener: LedgerListener) -> None:
    with engine.connect() as conn:
        killed = conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'test-listener'"
        )).scalars().all()
    assert killed == [True]
    # The loss is noticed, the retry comes after the backoff, and a resync says "re-read".
    collect(listener, lambda ev: RESYNC in ev, timeout=10)
    assert listener.listening and listener.reconnects >= 1
    ledger.enqueue(engine, "w", {})
    collect(listener, lambda ev: runs_of(ev) == [("w", "QUEUED")])


def test_a_listener_without_a_database_never_blocks() -> None:
    lst = LedgerListener("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1", name="nowhere")
    started = time.monotonic()
    for _ in range(20):
        assert lst.step() == []
    assert time.monotonic() - started < 1.0
    assert not lst.listening and lst.last_error is not None
    assert lst.due_at() > time.monotonic()  # backing off
    lst.close()


def test_a_deeply_nested_or_forged_notification_is_dropped_and_the_connection_stays(engine: Engine) -> None:
    """The runner's wake-up and the API's relay share this listener: ``repeat('[', 7000)`` used to raise
    RecursionError out of the parser and drop the LISTEN connection (every stream went offline)."""
    from runner.wakeup import Wakeup

    dropped: list[str] = []
    lst = LedgerListener(conninfo_for(engine, application_name="test-hostile"), name="hostile",
                         on_drop=dropped.append)
    collect(lst, lambda ev: RESYNC in ev)
    wakeup = Wakeup(lst, ["w"])
    with engine.begin() as conn:
        for payload in ("[" * 7000, '{"kind":"run","run_id":"x","worker":"w","status":"QUEUED","cancel":false}',
                        f'{{"kind":"run","run_id":"{uuid.uuid4()}","worker":"w","status":"QUEUED","cancel":"yes"}}'):
            conn.execute(text("SELECT pg_notify('scrinalia_ledger', :p)"), {"p": payload})
    deadline = time.monotonic() + 5
    while len(dropped) < 3 and time.monotonic() < deadline:
        assert not wakeup.read().claim  # nothing forged wakes the supervisor
        time.sleep(0.02)
    assert dropped == ["too_deep", "bad_uuid", "bad_cancel"] and lst.dropped == 3
    assert lst.listening and lst.reconnects == 0
    ledger.enqueue(engine, "w", {})
    deadline = time.monotonic() + 5
    while not wakeup.read().claim:
        assert time.monotonic() < deadline, "the real notification was not heard"
        time.sleep(0.02)
    lst.close()


def _wakeup_news_until(wakeup, done, timeout: float = 5.0) -> tuple[bool, set[uuid.UUID]]:
    """Read ``wakeup`` (waiting on its socket) until ``done(claimed, cancelled)``: what all reads said."""
    import select

    claimed, cancelled = False, set[uuid.UUID]()
    deadline = time.monotonic() + timeout
    while not done(claimed, cancelled):
        assert time.monotonic() < deadline, (claimed, cancelled)
        fd = wakeup.fileno()
        if fd is not None:
            select.select([fd], [], [], 0.1)
        news = wakeup.read()
        claimed, cancelled = claimed or news.claim, cancelled | news.cancelled
    return claimed, cancelled


def test_the_wakeup_claims_for_its_workers_and_names_the_runs_asked_to_cancel(engine: Engine) -> None:
    """Only a QUEUED run of one of its workers (or a resync) says "claim now"; only a RUNNING run with a
    cancel request is named cancelled; each read that says "claim" counts one wake-up."""
    from runner.wakeup import Wakeup

    lst = LedgerListener(conninfo_for(engine, application_name="test-wakeup"), name="wakeup")
    collect(lst, lambda ev: RESYNC in ev)
    wakeup = Wakeup(lst, ["w"])
    asked, running, queued = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    notes = [("other", "QUEUED", False, queued), ("w", "RUNNING", False, running), ("w", "SUCCESS", True, queued),
             ("w", "RUNNING", True, asked)]
    with engine.begin() as conn:
        for worker, status, cancel, run_id in notes:
            payload = (f'{{"kind":"run","run_id":"{run_id}","worker":"{worker}","status":"{status}",'
                       f'"cancel":{str(cancel).lower()}}}')
            conn.execute(text("SELECT pg_notify('scrinalia_ledger', :p)"), {"p": payload})
    claimed, cancelled = _wakeup_news_until(wakeup, lambda claimed, cancelled: asked in cancelled)
    assert not claimed and cancelled == {asked} and wakeup.wakeups == 0
    ledger.enqueue(engine, "w", {})
    claimed, cancelled = _wakeup_news_until(wakeup, lambda claimed, cancelled: claimed)
    assert cancelled == set() and wakeup.wakeups == 1
    lst.close()


def _notify_runs(engine: Engine, count: int) -> None:
    """``count`` distinct QUEUED notifications for worker ``w`` in one transaction (one burst on the socket)."""
    with engine.begin() as conn:
        conn.execute(text(
            "SELECT pg_notify('scrinalia_ledger', json_build_object('kind', 'run', 'run_id', gen_random_uuid(), "
            "'worker', 'w', 'status', 'QUEUED', 'cancel', false)::text) FROM generate_series(1, :n)"), {"n": count})


def test_a_flood_is_read_in_bounded_steps_and_the_rest_is_due_now(engine: Engine) -> None:
    """One step hands over at most MAX_EVENTS_PER_STEP events; the rest, already off the socket, makes
    ``due_at`` say "now" (not the next socket readiness) and comes with the next step."""
    from scrinalia.domains.archive.ledger_events import MAX_EVENTS_PER_STEP

    lst = LedgerListener(conninfo_for(engine, application_name="test-flood"), name="flood")
    collect(lst, lambda ev: RESYNC in ev)
    _notify_runs(engine, MAX_EVENTS_PER_STEP + 5)
    first = collect(lst, lambda ev: len(ev) >= MAX_EVENTS_PER_STEP, timeout=10)
    if len(first) == MAX_EVENTS_PER_STEP:  # the whole burst had arrived by the step that read it
        assert lst.due_at() <= time.monotonic()
    rest = collect(lst, lambda ev: len(first) + len(ev) >= MAX_EVENTS_PER_STEP + 5, timeout=10)
    assert len(first) + len(rest) == MAX_EVENTS_PER_STEP + 5 and lst.due_at() > time.monotonic()
    assert {ev.kind for ev in first + rest} == {"run"}
    lst.close()


def test_a_probing_listener_resyncs_once_when_its_probe_comes_back(engine: Engine) -> None:
    """With a probe the LISTEN is worth nothing until its own NOTIFY comes back: no resync at subscribe,
    one when the probe is heard, none for a later probe; the ledger's events pass as usual."""
    from scrinalia.domains.archive.ledger_events import send_probe

    lst = LedgerListener(conninfo_for(engine, application_name="test-probe"), name="probe", probe=True)
    collect(lst, lambda ev: lst.probe_wanted())
    assert not lst.hears
    send_probe(engine, lst.probe_channel)
    lst.probe_sent()
    assert collect(lst, lambda ev: RESYNC in ev) == [RESYNC] and lst.hears
    send_probe(engine, lst.probe_channel)
    _notify_runs(engine, 1)
    later = collect(lst, lambda ev: len(ev) >= 1)
    assert [ev.kind for ev in later] == ["run"]
    lst.close()
