"""The runner's least-privilege role (``scrinalia db runner-role``; docs/security.md "Database roles").

``RUNNER_GRANTS`` is the whole of what the role may do: per table and per verb, the columns that the
runner's statements touch, read off the code that runs as the runner (the ledger's protocol steps, the
registry, the worker SDK and every worker of ``scrinalia.domains.archive.workers``). Everything else is
revoked: no DELETE on the ledger, the registry or the documents, no INSERT of a ledger row other than
the one-shot CLI's own RUNNING row, no UPDATE of who asked for a run or what was asked, no TEMP, no
DDL, nothing of ``auth_*``. ``tests/foundation/test_runner_role.py`` runs every worker and the whole
protocol as this role, so a statement that needs more fails there first.

Re-running the command is safe, also for a schema owner that is not a superuser but has CREATEROLE
(PostgreSQL 15 refuses such an owner any ``ALTER ROLE ... NOSUPERUSER``, even a no-op): role
attributes are only changed when they differ from what the role must have.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy import Engine

from scrinalia.db.tables import metadata

ALL = ("*",)  # a verb on the whole table (no column list)


@dataclass(frozen=True, slots=True)
class TableGrant:
    """What the runner may do on one table; ``why`` names the statements that need it."""

    table: str
    select: bool = True
    insert: tuple[str, ...] = ()
    update: tuple[str, ...] = ()
    delete: bool = False
    why: str = ""

    def privileges(self) -> list[tuple[str, tuple[str, ...]]]:
        """(verb, columns) pairs; ``ALL`` means the whole table."""
        out: list[tuple[str, tuple[str, ...]]] = []
        if self.select:
            out.append(("SELECT", ALL))
        if self.insert:
            out.append(("INSERT", self.insert))
        if self.update:
            out.append(("UPDATE", self.update))
        if self.delete:
            out.append(("DELETE", ALL))
        return out


_RUN_PROTOCOL_COLUMNS = (
    # claim_next, heartbeat, expire_leases
    "status", "runner_id", "started_at", "heartbeat_at", "lease_expires_at", "progress",
    # record_start (config and options: the previous release's, which writes them into the run's row)
    "engine_name", "preset", "config", "options",
    # finish (and expire_leases, request_cancel)
    "finished_at", "duration_ms", "error", "exit_code", "exit_signal", "exit_reason", "metrics", "result",
    "cancel_requested_at", "cancel_requested_by",
)

RUNNER_GRANTS: tuple[TableGrant, ...] = (
    TableGrant("alembic_version", why="check_schema: the schema revision at start"),
    TableGrant(
        "archive_worker_runs",
        # ledger.create_running: the one-shot CLI's own RUNNING row (nothing else is inserted by a runner)
        insert=("worker_name", "status", "trigger", "requested_by", "request", "runner_id",
                "started_at", "heartbeat_at", "lease_expires_at"),
        update=_RUN_PROTOCOL_COLUMNS,
        why="claim_next, record_start, heartbeat, finish, expire_leases, request_cancel (one-shot Ctrl-C), "
            "create_running (one-shot CLI), get_run; the batch fence's check at COMMIT takes the row FOR SHARE "
            "(which needs UPDATE on a column: it has)",
    ),
    TableGrant("archive_worker_run_configs", insert=("run_id", "config", "options"),
               why="record_start: the resolved configuration, once (migration 0022); every run read returns it"),
    TableGrant(
        "archive_worker_runners",
        insert=("runner_id", "name", "kind", "hostname", "pid", "package_version", "schema_revision",
                "capabilities", "concurrency", "heartbeat_seconds", "lease_seconds", "poll_seconds", "devices",
                "children", "sees", "started_at", "last_heartbeat_at"),
        update=("last_heartbeat_at", "children", "warm", "stopped_at"),
        why="registry.register, the heartbeat's registry renewal, registry.stop, `scrinalia-runner status`",
    ),
    TableGrant("archive_worker_runner_reports", insert=("runner_id", "devices", "sees"), update=("warm",),
               why="registry.register: the devices, the model directories seen; the heartbeat: the warm models "
                   "(migration 0023); every registry read returns them"),
    TableGrant(
        "archive_documents",
        update=("execution_log",                                             # every stamp (StampQueue)
                "title", "scope_and_content", "admin_biographical_history", "provenance",  # cleaning
                "cleaning_ruleset", "cleaning_text_stamp", "updated_at",     # cleaning, quality
                "is_anomaly", "anomaly_reasons", "status"),                  # quality-validator
        why="the workers' fetches and counts, write_stamps, cleaning's rewrite, quality's flags",
    ),
    TableGrant(
        "archive_document_embeddings",
        insert=("document_id", "model", "dimensions", "vector", "text_md5", "run_id"),
        update=("model", "dimensions", "vector", "text_md5", "run_id", "updated_at"),
        why="embedding's upsert (ON CONFLICT DO UPDATE)",
    ),
    TableGrant("archive_entities", insert=("label", "name", "normalized_name"),
               why="ner's entity upsert (ON CONFLICT DO NOTHING) and id lookup"),
    TableGrant("archive_document_entities", insert=("document_id", "entity_id", "score", "mentions", "run_id"),
               delete=True, why="ner replaces a document's links (DELETE then INSERT)"),
    TableGrant("archive_document_typologies", insert=("document_id", "typology_id", "score", "run_id"),
               delete=True, why="typology replaces a document's links (DELETE then INSERT)"),
    TableGrant("archive_review_queue", insert=("document_id", "reason", "details", "source_run_id"),
               update=("reason", "details", "source_run_id"),
               why="quality-validator's open review item (ON CONFLICT DO UPDATE); quality reads has-entities"),
    TableGrant("archive_batch_fences", insert=("run_id", "runner_id"), delete=True,
               why="ledger.register_batch_fence (the SDK's commit) inserts the fence; its trigger at COMMIT "
                   "(migration 0008, run as the invoker) deletes it"),
    TableGrant("archive_worker_settings", why="the supervisor resolves the run's effective settings at claim"),
    TableGrant("archive_cleaning_rules", why="cleaning's REWRITE rules, quality's VALIDATE and LLM_CHECK rules"),
    TableGrant("archive_typologies", why="typology's active typologies"),
    TableGrant("archive_entity_stopwords", why="ner's filters"),
    TableGrant("archive_entity_exclusions", why="ner's filters"),
)

#: Tables the runner never touches: the identity tables, and what only the API and the scheduler use.
#: ``archive_stamp_counts`` is written by the triggers of archive_documents, which run as their owner
#: (SECURITY DEFINER, migration 0010) when a worker's stamps fire them: the role itself needs nothing.
#: ``archive_worker_run_samples`` likewise, by the triggers of the progress and the heartbeat (0015).
NO_ACCESS = frozenset({
    "auth_users", "auth_sessions", "auth_login_throttle", "auth_devices",
    "archive_worker_schedules", "archive_worker_setting_revisions", "archive_stamp_counts",
    "archive_worker_run_samples", "archive_run_totals", "archive_run_totals_watermark"})
_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")  # room for the policies' suffixes in 63 characters
#: What the role must be; ``rolinherit`` is left alone (the role is a member of nothing).
_ATTRIBUTES = {"rolcanlogin": ("LOGIN", True), "rolsuper": ("NOSUPERUSER", False),
               "rolcreatedb": ("NOCREATEDB", False), "rolcreaterole": ("NOCREATEROLE", False),
               "rolreplication": ("NOREPLICATION", False), "rolbypassrls": ("NOBYPASSRLS", False)}


# The runner's row-security policies on the ledger (row security is enabled by migrations 0002 and 0022),
# by (table, name suffix). What a column grant cannot say: the one INSERT a runner makes of a run is the
# one-shot CLI's RUNNING row under a registered, running runner id; a runner updates only active rows, never
# the finished history; and it records a configuration only for a RUNNING run (migration 0022 creates the
# same policy for the roles that exist when it runs).
POLICIES = {
    ("archive_worker_runs", "insert"):
        "AS RESTRICTIVE FOR INSERT TO {role} WITH CHECK ("
        "status = 'RUNNING' AND trigger = 'CLI' AND runner_id IS NOT NULL AND EXISTS ("
        "SELECT 1 FROM archive_worker_runners AS r "
        "WHERE r.runner_id = archive_worker_runs.runner_id AND r.stopped_at IS NULL))",
    ("archive_worker_runs", "update"):
        "AS RESTRICTIVE FOR UPDATE TO {role} USING (status IN ('QUEUED', 'RUNNING')) WITH CHECK (true)",
    ("archive_worker_run_configs", "config_insert"):
        "AS RESTRICTIVE FOR INSERT TO {role} WITH CHECK (EXISTS (SELECT 1 FROM archive_worker_runs AS r "
        "WHERE r.run_id = archive_worker_run_configs.run_id AND r.status = 'RUNNING'))",
}


class RunnerRoleError(RuntimeError):
    """The role cannot be made least-privilege by this owner (the message says what to do)."""


def runner_grants() -> dict[str, TableGrant]:
    """Table -> grant; every table of the schema is either here or in ``NO_ACCESS`` (a test checks it)."""
    return {g.table: g for g in RUNNER_GRANTS}


@dataclass(frozen=True, slots=True)
class RunnerRoleReport:
    role: str
    created: bool
    altered: tuple[str, ...]        # attributes changed now
    temp_revoked: bool              # TEMP on this database is no longer PUBLIC's
    connect_revoked: tuple[str, ...]  # other databases whose PUBLIC CONNECT this owner revoked
    still_connects: tuple[str, ...]   # other databases the role may still connect to (pg_hba.conf)


def ensure_runner_role(engine: Engine, role: str = "scrinalia_runner", password: str | None = None) -> RunnerRoleReport:
    """Create (or bring up to date) the role and set exactly its privileges on this database.

    Needs CREATEROLE and the ownership of the tables (the schema owner that ran the migrations).
    """
    if not _ROLE_NAME.match(role):
        raise ValueError("role must be a lower-case SQL identifier")
    ident = sql.Identifier(role)
    with engine.begin() as conn:
        raw: Any = conn.connection.driver_connection  # psycopg's connection: the SQL composed below is its own
        with raw.cursor() as cur:
            created, altered = _ensure_attributes(cur, role, ident)
            if password is not None:
                cur.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(ident, sql.Literal(password)))
            cur.execute("SELECT current_database()")
            database = cur.fetchone()[0]
            db = sql.Identifier(database)
            cur.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db, ident))
            cur.execute(sql.SQL("REVOKE TEMPORARY, CREATE ON DATABASE {} FROM {}").format(db, ident))
            # TEMP comes from PUBLIC by default, and a role cannot be denied what PUBLIC holds. Only the
            # database's owner can take it from PUBLIC; it keeps its own (an owner holds every privilege).
            if _owns_database(cur, database):
                cur.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(db))
            cur.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident))
            cur.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(ident))
            cur.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}").format(ident))
            cur.execute(sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {}").format(ident))
            _grant_tables_and_policies(cur, role, ident)
            connect_revoked = _revoke_connect_elsewhere(cur, database)
            cur.execute(
                "SELECT datname FROM pg_database WHERE datallowconn AND datname <> %s "
                "AND has_database_privilege(%s, datname, 'CONNECT') ORDER BY datname", (database, role))
            still = tuple(r[0] for r in cur.fetchall())
            cur.execute("SELECT has_database_privilege(%s, %s, 'TEMP')", (role, database))
            temp_revoked = not cur.fetchone()[0]
    return RunnerRoleReport(role, created, altered, temp_revoked, connect_revoked, still)


def _grant_tables_and_policies(cur: Any, role: str, ident: sql.Identifier) -> None:
    """``RUNNER_GRANTS`` (by column where a grant names columns) and the role's ``POLICIES``."""
    for grant in RUNNER_GRANTS:
        table = sql.Identifier(grant.table)
        for verb, columns in grant.privileges():
            target = sql.SQL("") if columns == ALL else sql.SQL(" ({})").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in columns))
            cur.execute(sql.SQL("GRANT {}{} ON {} TO {}").format(sql.SQL(verb), target, table, ident))
    for (table_name, suffix), body in POLICIES.items():
        name, on = sql.Identifier(f"{role}__{suffix}"), sql.Identifier(table_name)
        cur.execute(sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(name, on))
        cur.execute(sql.SQL("CREATE POLICY {} ON {} " + body).format(name, on, role=ident))


def _ensure_attributes(cur, role: str, ident: sql.Identifier) -> tuple[bool, tuple[str, ...]]:
    """CREATE the role, or ALTER only the attributes that differ (a CREATEROLE owner may not even
    repeat NOSUPERUSER on PostgreSQL 15). A superuser runner role is refused, not silently kept."""
    columns = ", ".join(_ATTRIBUTES)
    cur.execute(f"SELECT {columns} FROM pg_roles WHERE rolname = %s", (role,))
    row = cur.fetchone()
    if row is None:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        return True, ()
    wrong = [clause for (name, (clause, want)), have in zip(_ATTRIBUTES.items(), row, strict=True) if have != want]
    if wrong:
        cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if not cur.fetchone()[0] and set(wrong) & {"NOSUPERUSER", "NOREPLICATION", "NOBYPASSRLS"}:
            raise RunnerRoleError(
                f"role {role} has {', '.join(w.removeprefix('NO') for w in wrong if w.startswith('NO'))}: "
                "only a superuser can take that away (ALTER ROLE ... " + " ".join(wrong) + ")")
        cur.execute(sql.SQL("ALTER ROLE {} " + " ".join(wrong)).format(ident))
    return False, tuple(wrong)


def _owns_database(cur, database: str) -> bool:
    cur.execute("SELECT pg_has_role(current_user, datdba, 'USAGE') FROM pg_database WHERE datname = %s", (database,))
    return bool(cur.fetchone()[0])


def _revoke_connect_elsewhere(cur, database: str) -> tuple[str, ...]:
    """PUBLIC's CONNECT on the other databases that this owner itself owns (the role would have it
    through PUBLIC). Not for a superuser, whose "other databases" are the whole cluster's, and never
    a template: a database owned by someone else is restricted in pg_hba.conf (docs/security.md)."""
    cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if cur.fetchone()[0]:
        return ()
    cur.execute(
        "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate AND datname <> %s "
        "AND datdba = (SELECT oid FROM pg_roles WHERE rolname = current_user) "
        "AND has_database_privilege('public', datname, 'CONNECT') ORDER BY datname", (database,))
    names = tuple(r[0] for r in cur.fetchall())
    for name in names:
        cur.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
    return names


def unmanaged_tables() -> set[str]:
    """Tables of the schema that are neither granted nor explicitly withheld (must be empty)."""
    return set(metadata.tables) - set(runner_grants()) - NO_ACCESS
