"""Session bounds are sent with every transaction, in the same round trip as its first statement
(issue 18; decision 0121), so a transaction pooler that drops libpq's ``options`` drops no bound; no
connection prepares a statement on the server. Read off libpq's protocol trace on a real session."""
from __future__ import annotations

from sqlalchemy import text

from scrinalia.db.engine import bounds_statement, create_engine_from_url, one_statement, session_bounds_in
from tests.ledger.helpers import WireTrace

BOUNDS = "-c statement_timeout=700 -c lock_timeout=300 -c idle_in_transaction_session_timeout=900"


def _frontend(trace: WireTrace) -> list[str]:
    """The frontend's messages, by type (Parse, Bind, Execute, Sync, Query, ...)."""
    trace._file.flush()
    trace._file.seek(0)
    kinds = [line.split("\t")[3].split(" ")[0].strip() for line in trace._file
             if len(line.split("\t")) > 3 and line.split("\t")[1] == "F"]
    trace._file.seek(0, 2)
    return kinds


def test_a_step_carries_its_bounds_in_its_one_round_trip(database_url):
    engine = create_engine_from_url(database_url, pool_pre_ping=False, connect_args={"options": BOUNDS})
    trace = WireTrace(engine)
    try:
        with engine.connect() as conn:  # the dialect's first-connect questions, before counting
            conn.exec_driver_sql("SELECT 1")
        before, sent_before = len(_frontend(trace)), len(trace.statements())
        with one_statement(engine) as conn:
            shown = conn.execute(text(
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
                "current_setting('idle_in_transaction_session_timeout'), :x"), {"x": 1}).one()
        with one_statement(engine) as conn:  # local to that transaction: nothing is left on the session
            conn.execute(text("SET statement_timeout = 0"))
            after = conn.execute(text("SELECT current_setting('statement_timeout')")).scalar_one()
        kinds = _frontend(trace)[before:]
        sent = trace.statements()[sent_before:]
    finally:
        engine.dispose()
    assert tuple(shown) == ("700ms", "300ms", "900ms", 1)
    assert after == "700ms"  # the next transaction gets its bounds again, whatever the session holds
    assert sent[0] == bounds_statement(session_bounds_in(BOUNDS)) and len(sent) == 6, sent
    assert kinds.count("Sync") == 3 and "Query" not in kinds, kinds  # one Sync per step: one round trip


def test_no_bounds_no_extra_statement_and_never_a_prepared_one(database_url):
    engine = create_engine_from_url(database_url, pool_pre_ping=False)
    trace = WireTrace(engine)
    try:
        for _ in range(10):  # psycopg would prepare a statement run 5 times (its prepare_threshold)
            with one_statement(engine) as conn:
                conn.execute(text("SELECT :x"), {"x": 1})
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one() == 0
    finally:
        engine.dispose()
    assert not any("set_config" in s for s in trace.statements())
