"""The runner's least-privilege role (ADR 0014, decision 6).

``scrinalia_runner`` may read the schema revision, run the ledger protocol and the registry, read the
worker settings and the archive's reference tables, and write the archive's enrichment tables. It has
no access to ``auth_users`` / ``auth_sessions`` and no DDL. The role is hardening: a worker still has
archival write authority, which is its nature.
"""
from __future__ import annotations

import re

from psycopg import sql
from sqlalchemy import Engine, text

from scrinalia.db.tables import metadata

# Read-only for the runner: configuration and reference data written by the API or by curators.
READ_ONLY = {
    "archive_worker_settings",
    "archive_worker_setting_revisions",
    "archive_worker_schedules",
    "archive_typologies",
    "archive_cleaning_rules",
    "archive_entity_stopwords",
    "archive_entity_exclusions",
}
NO_ACCESS_PREFIX = "auth_"
_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def runner_grants() -> dict[str, str]:
    """Table -> privileges, derived from the schema so a new archive table is not forgotten."""
    grants = {"alembic_version": "SELECT"}
    for name in metadata.tables:
        if name.startswith(NO_ACCESS_PREFIX):
            continue
        grants[name] = "SELECT" if name in READ_ONLY else "SELECT, INSERT, UPDATE, DELETE"
    return grants


def ensure_runner_role(engine: Engine, role: str = "scrinalia_runner", password: str | None = None) -> None:
    """Create (or update) the role and set exactly its privileges. Needs CREATEROLE and table ownership."""
    if not _ROLE_NAME.match(role):
        raise ValueError("role must be a lower-case SQL identifier")
    ident = sql.Identifier(role)
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            verb = "ALTER" if cur.fetchone() else "CREATE"
            cur.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE").format(ident))
            if password is not None:
                cur.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(ident, sql.Literal(password)))
            database = conn.execute(text("SELECT current_database()")).scalar_one()
            cur.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), ident))
            cur.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident))
            cur.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(ident))
            cur.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}").format(ident))
            for table, privileges in runner_grants().items():
                cur.execute(sql.SQL("GRANT " + privileges + " ON {} TO {}").format(sql.Identifier(table), ident))
