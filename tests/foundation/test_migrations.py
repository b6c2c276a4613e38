"""The schema is created only by alembic, and the migrations round-trip."""
from __future__ import annotations

from collections.abc import Sequence

from alembic import command
from alembic.script import Script, ScriptDirectory
from sqlalchemy import inspect, text

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.tables import metadata
from tests.foundation.schema_facts import Snapshot, removed, schema_facts
from tests.foundation.schema_revision import head_declaration


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


def _revisions_in_order() -> list[Script]:
    """The bundled revisions from the first to the head (one line: the tests of the chain need one)."""
    script = ScriptDirectory.from_config(migrate.alembic_config())
    return list(reversed(list(script.walk_revisions())))


def test_no_migration_removes_what_the_code_before_it_relies_on(empty_database_url):
    """Expand/contract (decision 0125): each migration only adds. Whatever code written for the
    revision before it can rely on (tables, columns and their types, NULL allowed, defaults, enum
    labels, functions, unique indexes, what each CHECK accepts, rows visible to every role) is still
    there after it, unless the migration names it in ``CONTRACT``: the contract step, one release
    after the code that read it was replaced (docs/operations.md, "Upgrading")."""
    engine = create_engine_from_url(empty_database_url)
    problems: list[str] = []
    before: Snapshot | None = None
    declarations: list[tuple[str, bool, str | None]] = []
    try:
        for revision in _revisions_in_order():
            migrate.upgrade(empty_database_url, revision.revision)
            with engine.connect() as conn:
                after = schema_facts(conn)
                oldest = migrate.oldest_compatible(conn)
            declared = set(getattr(revision.module, "CONTRACT", ()))
            if before is not None:
                lost = removed(before, after)
                problems += [f"{revision.revision} removes: {fact}" for fact in sorted(lost - declared)]
                problems += [f"{revision.revision} declares a contract it does not make: {fact}"
                             for fact in sorted(declared - lost)]
            declarations.append((revision.revision, bool(declared), oldest))
            before = after
    finally:
        engine.dispose()
    problems += contract_steps_that_keep_the_declaration(declarations)
    assert not problems, "\n".join(problems)


def contract_steps_that_keep_the_declaration(walk: Sequence[tuple[str, bool, str | None]]) -> list[str]:
    """Decision 0392: a migration that removes what earlier code reads (a non-empty ``CONTRACT``) must say
    so to that code, by raising ``scrinalia_schema_oldest_compatible()`` to a later revision. ``walk``: per
    revision in order, whether it contracts and the declaration after it (None before migration 0021)."""
    order = [revision for revision, _, _ in walk]
    problems = []
    for (_, _, previous), (revision, contracts, oldest) in zip(walk, walk[1:], strict=False):
        if previous is None or not contracts:
            continue
        if oldest is None or oldest not in order or order.index(oldest) <= order.index(previous):
            problems.append(f"{revision} contracts but leaves scrinalia_schema_oldest_compatible() at "
                            f"{oldest!r} (was {previous!r}): earlier code would still take it for compatible")
    return problems


def test_a_contract_step_must_raise_the_declaration():
    """The rule above, on walks that break and keep it (no migration of this release contracts yet)."""
    first = ("0001_initial", False, None)
    kept = [first, ("0021", False, "0001_initial"), ("0022", False, "0001_initial"), ("0023", True, "0021")]
    assert contract_steps_that_keep_the_declaration(kept) == []
    unchanged = [first, ("0021", False, "0001_initial"), ("0022", True, "0001_initial")]
    assert contract_steps_that_keep_the_declaration(unchanged) == [
        "0022 contracts but leaves scrinalia_schema_oldest_compatible() at '0001_initial' (was '0001_initial'): "
        "earlier code would still take it for compatible"]
    assert contract_steps_that_keep_the_declaration([("0010", True, None), ("0011", True, None)]) == []


def test_the_schema_declares_the_previous_release_compatible(engine):
    """Head's declaration names the previous release's newest revision: that release runs on this schema
    (test_previous_release.py), and nothing older exists."""
    with engine.connect() as conn:
        assert migrate.oldest_compatible(conn) == head_declaration() == "0001_initial"
    assert head_declaration() == _revisions_in_order()[0].revision


def test_the_facts_catch_a_dropped_column_a_narrowed_check_and_a_required_column(engine):
    """The comparison itself can fail: each kind of incompatible change is seen."""
    with engine.connect() as conn:
        before = schema_facts(conn)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE auth_users DROP COLUMN last_login_at"))
        conn.execute(text("ALTER TABLE auth_sessions ALTER COLUMN client_address SET NOT NULL"))
        conn.execute(text("ALTER TABLE archive_worker_runs ADD COLUMN owner_team text NOT NULL"))
        conn.execute(text("ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason"))
        conn.execute(text("ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason "
                          "CHECK (exit_reason IN ('exception', 'signal'))"))
        conn.execute(text("ALTER TABLE auth_devices ENABLE ROW LEVEL SECURITY"))
        conn.execute(text("ALTER TYPE user_role RENAME VALUE 'VIEWER' TO 'READER'"))
    with engine.connect() as conn:
        after = schema_facts(conn)
    lost = removed(before, after)
    assert "column auth_users.last_login_at timestamp with time zone" in lost
    assert "nullable auth_sessions.client_address" in lost
    assert "an INSERT that does not name archive_worker_runs.owner_team (NOT NULL, no default)" in lost
    assert any(f.startswith("check archive_worker_runs.ck_run_exit_reason accepts") for f in lost)
    assert "every role sees every row of auth_devices" in lost
    assert "enum user_role VIEWER" in lost
