"""What the ledger costs the shared database: one round trip per protocol step, time-ordered run ids
made by the database, a heartbeat that leaves an unchanged registry snapshot alone (issue 14)."""
from __future__ import annotations

import secrets
import uuid

from sqlalchemy import text

from scrinalia.db.engine import ServerFacts, create_engine_from_url
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import FinishParams, StartParams
from tests.ledger.helpers import WireTrace, register_runner

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "START TRANSACTION", "END")


def _uuid_ms(value: uuid.UUID) -> int:
    return int.from_bytes(value.bytes[:6], "big")


def test_new_run_ids_are_uuidv7_made_by_the_database_and_ordered_like_the_queue(engine):
    with engine.connect() as conn:
        default = conn.execute(text(
            "SELECT column_default FROM information_schema.columns "
            "WHERE table_name = 'archive_worker_runs' AND column_name = 'run_id'")).scalar_one()
    assert default == "archive_uuid_v7()"
    runs = [ledger.enqueue(engine, f"worker-{i:02d}", {}) for i in range(40)]
    # A row inserted by plain SQL, naming no run_id, gets one too: the database makes it, not Python.
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_worker_runs (worker_name, trigger, request) "
                          "VALUES ('plain-sql', 'API', '{}')"))
    plain = ledger.active_run(engine, "plain-sql")
    assert plain is not None
    runs.append(plain)
    ids = [r.run_id for r in runs]
    assert all(r.version == 7 and r.variant == uuid.RFC_4122 for r in ids)
    assert ids == sorted(ids, key=lambda u: u.bytes), "run ids are not in queued order"
    assert len(set(ids)) == len(ids)
    for run in runs:  # the id's clock is the database's, at the insert (queued_at is the statement's now())
        assert 0 <= _uuid_ms(run.run_id) - int(run.queued_at.timestamp() * 1000) < 5_000


def test_old_ids_are_kept_and_new_ones_sort_after_them(engine):
    old = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_worker_runs (run_id, worker_name, trigger, request, status, "
                          "finished_at) VALUES (:id, 'old', 'API', '{}', 'SUCCESS', now())"), {"id": old})
    new = ledger.enqueue(engine, "old", {})
    assert ledger.get_run(engine, old).run_id == old and new.run_id.version == 7


def test_every_protocol_step_is_one_statement_without_begin_or_commit(database_url):
    engine = create_engine_from_url(database_url, pool_size=2, pool_pre_ping=False)
    trace = WireTrace(engine)
    try:
        runner_id = uuid.uuid4()
        runs: dict[str, uuid.UUID] = {}
        steps = [
            lambda: registry.register(engine, registry.RunnerRegistration(
                runner_id=runner_id, name="rt", hostname="h", pid=1, package_version="t", schema_revision=None,
                capabilities=["a", "b"], concurrency=2, heartbeat_seconds=15, lease_seconds=60)),
            lambda: ledger.enqueue(engine, "a", {}),
            lambda: ledger.enqueue(engine, "b", {}),
            lambda: ledger.claim_next(engine, runner_id, ["a"], 60),
            lambda: ledger.record_start(engine, runs["active"], runner_id, StartParams(engine_name=None, preset=None,
                                        config={}, options={})),
            lambda: ledger.heartbeat(engine, runner_id, 60, children=[{"pid": 1}]),
            lambda: ledger.finish(engine, runs["active"], runner_id, FinishParams("SUCCESS")),
            lambda: ledger.expire_leases(engine),
            lambda: ledger.request_cancel(engine, runs["queued"]),
            lambda: ledger.get_run(engine, runs["queued"]),
            lambda: registry.request_drain(engine, runner_id, "t"),
            lambda: registry.get_runner(engine, runner_id),
            lambda: registry.stop(engine, runner_id),
        ]
        with engine.connect() as conn:  # the dialect's first-connect questions, before counting
            conn.exec_driver_sql("SELECT 1")
        before = len(trace.statements())
        for i, step in enumerate(steps):
            result = step()
            if i in (2, 3):
                runs["queued" if i == 2 else "active"] = result.run_id
        sent = trace.statements()[before:]
    finally:
        engine.dispose()
    control = [s for s in sent if s.upper().startswith(TRANSACTION_CONTROL)]
    assert control == [], f"transaction control sent around single statements: {control}"
    assert len(sent) == len(steps), sent


def test_a_heartbeat_leaves_an_unchanged_snapshot_alone(engine):
    """A big snapshot (16 children) lives in the registry table's TOAST; rewriting it every beat writes it
    again (new chunks, WAL). An unchanged one keeps its chunks: their xmin does not move."""
    runner_id = register_runner(engine, ["embedding"])
    children = [{"pid": 1000 + i, "run_id": str(uuid.uuid4()), "note": secrets.token_hex(150)} for i in range(16)]

    def chunk_xmins() -> set[str]:
        with engine.connect() as conn:
            toast = conn.execute(text(
                "SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'archive_worker_runners'::regclass"
            )).scalar_one()
            return set(conn.execute(text(f"SELECT DISTINCT xmin::text FROM {toast}")).scalars())

    ledger.heartbeat(engine, runner_id, 60, children=children)
    first = chunk_xmins()
    assert first, "the snapshot is not in TOAST: the test would prove nothing"
    ledger.heartbeat(engine, runner_id, 60, children=children)
    ledger.heartbeat(engine, runner_id, 60, children=None)
    assert chunk_xmins() == first
    assert registry.get_runner(engine, runner_id).children == children

    changed = children[:-1]
    ledger.heartbeat(engine, runner_id, 60, children=changed)
    assert chunk_xmins() != first and registry.get_runner(engine, runner_id).children == changed


def test_the_registry_has_no_index_on_the_column_every_heartbeat_changes(engine):
    """Without one, a beat is a HOT update (no new index entries)."""
    with engine.connect() as conn:
        defs = conn.execute(text(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'archive_worker_runners'")).scalars().all()
    assert defs and not any("last_heartbeat_at" in d for d in defs)


def test_an_engine_told_the_server_facts_asks_the_server_nothing_on_first_connect(engine, database_url):
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    facts = ServerFacts.of(engine)
    assert facts is not None and facts == ServerFacts.from_json(facts.to_json())

    told = create_engine_from_url(database_url, pool_pre_ping=False, server_facts=facts)
    untold = create_engine_from_url(database_url, pool_pre_ping=False)
    told_trace, untold_trace = WireTrace(told), WireTrace(untold)
    try:
        for eng in (told, untold):
            assert ledger.get_run(eng, uuid.uuid4()) is None
        assert ServerFacts.of(told) == facts
    finally:
        told.dispose()
        untold.dispose()
    assert len(told_trace.statements()) == 1, told_trace.statements()
    assert len(untold_trace.statements()) > 4  # version, current_schema, isolation, standard strings, ...
