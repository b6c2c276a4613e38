"""The schema's SQL functions name the schema of what they call (issue 10, decision 0050); the ledger
gets row security so that the runner's role can be kept off its history (decision 0052).

Revision ID: 0002
Revises: 0001_initial
Create Date: 2026-12-01

Autovacuum, ``pg_dump`` and ``pg_restore`` run with an empty ``search_path``. An IMMUTABLE function
behind a partial index (``ix_documents_pending_*``) that calls ``archive_composed_text`` without a
schema then fails: the automatic ANALYZE of ``archive_documents`` never succeeds and a restore stops at
``CREATE INDEX ix_documents_pending_embedding``. Each body below is 0001's, with every call of one of
our functions and every table qualified by the schema that holds them (``pg_catalog`` needs none: it is
always searched first). No ``SET search_path`` on the functions: a ``SET`` clause prevents inlining,
and the stamp functions are inlined into the workers' queue queries and the index predicates. The
results are unchanged, so the indexes stay valid without a rebuild.

Row security on ``archive_worker_runs``: enabled with one permissive policy for everyone, so nothing
changes for any role (the owner bypasses it anyway); ``scrinalia db runner-role`` then adds the runner
role's RESTRICTIVE policies (it may insert only the one-shot CLI's RUNNING row and update only active
rows), which a column grant cannot express.
"""
from alembic import op
from sqlalchemy import text

revision = "0002"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

# {s} is the quoted schema of the functions (where 0001 created them); {q} is "{s}." or "" (downgrade).
BODIES = r"""
CREATE OR REPLACE FUNCTION {s}.archive_text_stamp(title text, scope_and_content text, history text, provenance text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $ts$
SELECT md5({q}archive_composed_text(title, scope_and_content, history, provenance))
$ts$;

CREATE OR REPLACE FUNCTION {s}.archive_quality_stamp(title text, scope_and_content text, history text,
                                                     provenance text, date_text text, date_start date,
                                                     date_end date, execution_log jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $qs$
SELECT md5({q}archive_composed_text(title, scope_and_content, history, provenance)
  || chr(31) || coalesce(date_text, '')
  || chr(31) || coalesce((date_start - DATE '2000-01-01')::text, '')
  || chr(31) || coalesce((date_end - DATE '2000-01-01')::text, '')
  || chr(31) || coalesce(execution_log #>> '{{ner,run_id}}', '')
  || chr(31) || coalesce(execution_log #>> '{{typology,run_id}}', ''))
$qs$;

CREATE OR REPLACE FUNCTION {s}.archive_cleaning_ruleset()
RETURNS text LANGUAGE sql STABLE
AS $crset$
SELECT md5(string_agg(r.id::text || ':' || {q}archive_cleaning_rule_signature(r.field, r.pattern, r.replacement),
                      ',' ORDER BY r.id))
  FROM {q}archive_cleaning_rules AS r
 WHERE r.kind = 'REWRITE' AND r.active
   AND r.field IN ('title', 'scope_and_content', 'admin_biographical_history', 'provenance')
$crset$;
"""

_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_composed_text'"
)


def _replace_bodies(qualified: bool) -> None:
    schema = op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted
    op.execute(BODIES.format(s=schema, q=f"{schema}." if qualified else ""))


ROW_SECURITY = """
ALTER TABLE archive_worker_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY worker_runs_everyone ON archive_worker_runs USING (true) WITH CHECK (true);
"""

# Every policy of the table, the runner roles' included (they are inert without row security anyway).
NO_ROW_SECURITY = """
DO $drop$
DECLARE p record;
BEGIN
  FOR p IN SELECT policyname FROM pg_catalog.pg_policies WHERE tablename = 'archive_worker_runs' LOOP
    EXECUTE format('DROP POLICY %I ON archive_worker_runs', p.policyname);
  END LOOP;
END
$drop$;
ALTER TABLE archive_worker_runs DISABLE ROW LEVEL SECURITY;
"""


def upgrade() -> None:
    _replace_bodies(qualified=True)
    op.execute(ROW_SECURITY)


def downgrade() -> None:
    op.execute(NO_ROW_SECURITY)
    _replace_bodies(qualified=False)
