"""The runner's least-privilege role can run the protocol and cannot read identity or change the schema."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.roles import ensure_runner_role
from scrinalia.domains.archive import ledger
from tests.ledger.helpers import register_runner


def test_runner_role_least_privilege(database_url, engine):
    role = f"runner_{uuid.uuid4().hex[:8]}"
    ensure_runner_role(engine, role, password="runner-secret")
    ensure_runner_role(engine, role, password="runner-secret")  # idempotent
    runner_url = make_url(database_url).set(username=role, password="runner-secret")
    as_runner = create_engine_from_url(runner_url.render_as_string(hide_password=False))
    try:
        with as_runner.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision()
        me = register_runner(as_runner, ["embedding"])
        ledger.enqueue(engine, "embedding", {})
        run = ledger.claim_next(as_runner, me, ["embedding"], 60)
        assert ledger.heartbeat(as_runner, me, 60).held.keys() == {run.run_id}
        with as_runner.begin() as conn:
            conn.execute(text("INSERT INTO archive_documents (reference_code, title) VALUES ('R1', 'T')"))
            conn.execute(text("UPDATE archive_documents SET execution_log = '{\"x\": 1}'"))
        assert ledger.finish(as_runner, run.run_id, me, "SUCCESS") is not None

        for forbidden in ("SELECT * FROM auth_users", "SELECT * FROM auth_sessions",
                          "CREATE TABLE evil (id int)", "DROP TABLE archive_documents",
                          "UPDATE archive_worker_settings SET preset = 'x'"):
            with pytest.raises(ProgrammingError, match="permission denied|must be owner"), as_runner.begin() as conn:
                conn.execute(text(forbidden))
    finally:
        as_runner.dispose()
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
