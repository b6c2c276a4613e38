"""The schema is created only by alembic, and the migrations round-trip."""
from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.tables import metadata


def test_upgrade_check_downgrade_upgrade(empty_database_url):
    engine = create_engine_from_url(empty_database_url)
    try:
        with engine.connect() as conn:
            assert migrate.current_revision(conn) is None
        migrate.upgrade(empty_database_url)
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision()
        assert set(metadata.tables) <= set(inspect(engine).get_table_names())

        # `alembic check`: the metadata and the migrated database agree (raises on any difference).
        command.check(migrate.alembic_config(empty_database_url))

        migrate.downgrade(empty_database_url, "base")
        with engine.connect() as conn:
            leftovers = conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
            )).scalars().all()
            types = conn.execute(text(
                "SELECT typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                "WHERE n.nspname = 'public' AND t.typtype = 'e'")).scalars().all()
            assert leftovers == [] and types == []
            assert migrate.current_revision(conn) is None

        migrate.upgrade(empty_database_url)
        command.check(migrate.alembic_config(empty_database_url))
    finally:
        engine.dispose()


def test_the_queue_indexes_exist_as_designed(engine):
    with engine.connect() as conn:
        defs = dict(conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'archive_worker_runs'")).all())
    assert "UNIQUE" in defs["uq_worker_run_active"] and "WHERE (status = ANY" in defs["uq_worker_run_active"]
    assert "WHERE (status = 'RUNNING'" in defs["ix_worker_runs_runner"]
    # The active rows are at most one per worker and uq_worker_run_active holds them: no second index
    # over QUEUED or RUNNING rows costs an entry per enqueue or claim (migration 0003).
    assert "ix_worker_runs_claim" not in defs and "ix_worker_runs_lease" not in defs
