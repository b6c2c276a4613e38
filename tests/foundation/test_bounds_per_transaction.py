"""Session bounds are sent with every transaction whose session lacks them, in the same round trip as
its first statement (issue 18; decision 0121): through a transaction pooler that drops libpq's
``options`` every transaction carries them; on a direct connection, where ``options`` did its job, the
first transaction finds that out and nothing more is sent. No connection prepares a statement on the
server. Read off libpq's protocol trace on real sessions (a real PgBouncer for the pooled one)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import make_url

from scrinalia.db.engine import bounds_statement, create_engine_from_url, one_statement, session_bounds_in
from tests.ledger.helpers import WireTrace
from tests.topology.pgbouncer import DOCUMENTED_SETTINGS, pgbouncer

BOUNDS = "-c statement_timeout=700 -c lock_timeout=300 -c idle_in_transaction_session_timeout=900"
SHOW = ("SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
        "current_setting('idle_in_transaction_session_timeout'), :x")


def _frontend(trace: WireTrace) -> list[str]:
    """The frontend's messages, by type (Parse, Bind, Execute, Sync, Query, ...)."""
    trace._file.flush()
    trace._file.seek(0)
    kinds = [line.split("\t")[3].split(" ")[0].strip() for line in trace._file
             if len(line.split("\t")) > 3 and line.split("\t")[1] == "F"]
    trace._file.seek(0, 2)
    return kinds


def _steps(url: str, steps: int) -> tuple[list[tuple], list[str], list[str]]:
    """``steps`` one-statement steps on one pooled connection, each preceded by a session-level SET that
    a bound per transaction must override: what each step saw, the statements and the message types."""
    engine = create_engine_from_url(url, pool_size=1, max_overflow=0, pool_pre_ping=False,
                                    connect_args={"options": BOUNDS})
    trace = WireTrace(engine)
    try:
        with engine.connect() as conn:  # the dialect's first-connect questions, and the session check
            conn.exec_driver_sql("SELECT 1")
        before, sent_before = len(_frontend(trace)), len(trace.statements())
        seen = []
        for i in range(steps):
            with one_statement(engine) as conn:
                seen.append(tuple(conn.execute(text(SHOW), {"x": i}).one()))
        return seen, trace.statements()[sent_before:], _frontend(trace)[before:]
    finally:
        engine.dispose()


def test_through_pgbouncer_every_step_carries_its_bounds_in_its_one_round_trip(pg_admin_url, database_url):
    with pgbouncer(make_url(pg_admin_url).port or 5432, settings=DOCUMENTED_SETTINGS) as bouncer:
        pooled = make_url(database_url).set(port=bouncer.port).render_as_string(hide_password=False)
        seen, sent, kinds = _steps(pooled, 3)
    assert seen == [("700ms", "300ms", "900ms", i) for i in range(3)]
    assert sent[::2] == [bounds_statement(session_bounds_in(BOUNDS))] * 3 and len(sent) == 6, sent
    assert kinds.count("Sync") == 3 and "Query" not in kinds, kinds  # one Sync per step: one round trip


def test_on_a_direct_connection_the_options_suffice_and_nothing_more_is_sent(database_url):
    seen, sent, kinds = _steps(database_url, 3)
    assert seen == [("700ms", "300ms", "900ms", i) for i in range(3)]
    assert len(sent) == 3 and not any("set_config" in s for s in sent), sent
    assert kinds.count("Sync") == 3, kinds


def test_never_a_prepared_statement(database_url):
    engine = create_engine_from_url(database_url, pool_size=1, pool_pre_ping=False)
    try:
        for i in range(10):  # psycopg prepares a statement run 5 times (its default prepare_threshold)
            with one_statement(engine) as conn:
                conn.execute(text("SELECT :x"), {"x": i})
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one() == 0
    finally:
        engine.dispose()
