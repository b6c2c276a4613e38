"""The schema says which earlier releases may still run on it: ``scrinalia_schema_oldest_compatible()``
(decision 0392).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07

An API or a scheduler of this release refuses a revision it does not know (exit 7). Without more, that
makes this release impossible to roll back to once the next release has migrated, and makes its
``/healthz`` answer 503 through the next upgrade's window, though expand/contract (decision 0125) keeps
everything it reads. The function returns the oldest revision whose code may still serve on this schema;
code that knows that revision is compatible, code that does not is not. A migration that removes what some
earlier code reads (a contract step, ``CONTRACT``) replaces it with the oldest revision whose code still
runs, and ``tests/foundation/test_migrations.py`` fails a contract step that does not. Here: 0001_initial, the
previous release's head (``tests/foundation/test_previous_release.py`` runs that release on this schema).

Additive: one function, which nothing of the previous release calls.
"""
from alembic import op
from sqlalchemy import text

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

#: The oldest revision whose code may still run on this schema.
OLDEST_COMPATIBLE = "0001_initial"

_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_error_fingerprint'"
)


def upgrade() -> None:
    s = op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted
    op.execute(
        f"""
        CREATE FUNCTION {s}.scrinalia_schema_oldest_compatible() RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $$ SELECT '{OLDEST_COMPATIBLE}'::text $$;
        COMMENT ON FUNCTION {s}.scrinalia_schema_oldest_compatible() IS
            'The oldest migration revision whose code may still run on this schema (decision 0392).';
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS scrinalia_schema_oldest_compatible()")
