"""The document queues' predicates are SQL functions that the partial indexes and the workers both call
(issue 12, decision 0095).

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01

Before this revision each pending condition was written twice: as an f-string assembled in
``scrinalia/domains/archive/workers/stamps.py`` and as the predicate of its partial index in 0001. The
planner uses a partial index only when the query's condition proves the index's, so the two had to
stay identical by hand. Now the condition has one home, a function here:

  archive_stamp_pending(log, key, stamp)  the stamp recorded under ``key`` is not ``stamp``
  archive_pending_embedding(...)          backs ix_documents_pending_embedding
  archive_pending_ner(...)                backs ix_documents_pending_ner        (governed)
  archive_pending_typology(...)           backs ix_documents_pending_typology   (governed)
  archive_pending_quality(...)            backs ix_documents_pending_quality    (governed)
  archive_pending_cleaning_text(...)      backs ix_documents_pending_cleaning   (governed; the text arm)
  archive_has_stamp_error(log)            backs ix_documents_stamp_errors

Each is ``LANGUAGE sql IMMUTABLE PARALLEL SAFE``, not STRICT and without ``SET``, so PostgreSQL inlines
it, in the index predicate and in the query alike, and proves the one from the other. Every call of one
of our functions is qualified by the schema (decision 0050: autovacuum and pg_restore run with an empty
``search_path``). The indexes keep their names and columns; they are rebuilt on the function calls. The
results are the same rows as before, so nothing is re-queued.
"""
from alembic import op
from sqlalchemy import text

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# {s}: the quoted schema of the stamp functions (where 0001 created them).
FUNCTIONS = r"""
CREATE FUNCTION {s}.archive_stamp_pending(execution_log jsonb, key text, stamp text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $sp$
SELECT (execution_log #>> ARRAY[key, 'stamp']) IS DISTINCT FROM stamp
$sp$;

CREATE FUNCTION {s}.archive_pending_embedding(execution_log jsonb, title text, scope_and_content text,
                                              history text, provenance text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $pe$
SELECT {s}.archive_stamp_pending(execution_log, 'embedding',
                                 {s}.archive_text_stamp(title, scope_and_content, history, provenance))
$pe$;

CREATE FUNCTION {s}.archive_pending_ner(status {s}.document_status, execution_log jsonb, title text,
                                        scope_and_content text, history text, provenance text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $pn$
SELECT status <> 'HUMAN_APPROVED'
   AND {s}.archive_stamp_pending(execution_log, 'ner',
                                 {s}.archive_text_stamp(title, scope_and_content, history, provenance))
$pn$;

CREATE FUNCTION {s}.archive_pending_typology(status {s}.document_status, execution_log jsonb, title text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $pt$
SELECT status <> 'HUMAN_APPROVED' AND {s}.archive_stamp_pending(execution_log, 'typology', md5(title))
$pt$;

CREATE FUNCTION {s}.archive_pending_quality(status {s}.document_status, execution_log jsonb, title text,
                                            scope_and_content text, history text, provenance text,
                                            date_text text, date_start date, date_end date)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $pq$
SELECT status <> 'HUMAN_APPROVED'
   AND {s}.archive_stamp_pending(execution_log, 'quality-validator',
                                 {s}.archive_quality_stamp(title, scope_and_content, history, provenance,
                                                           date_text, date_start, date_end, execution_log))
$pq$;

CREATE FUNCTION {s}.archive_pending_cleaning_text(status {s}.document_status, cleaning_text_stamp text,
                                                  title text, scope_and_content text, history text,
                                                  provenance text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $pc$
SELECT status <> 'HUMAN_APPROVED'
   AND cleaning_text_stamp IS DISTINCT FROM {s}.archive_cleaning_text_stamp(title, scope_and_content, history,
                                                                            provenance)
$pc$;

CREATE FUNCTION {s}.archive_has_stamp_error(execution_log jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $he$
SELECT jsonb_path_exists(execution_log, '$.*.status ? (@ == "ERROR")')
    OR jsonb_path_exists(execution_log, '$.cleaning.*.status ? (@ == "ERROR")')
$he$;
"""

INDEXES = """
DROP INDEX {s}.ix_documents_pending_embedding;
CREATE INDEX ix_documents_pending_embedding ON {s}.archive_documents (id)
  WHERE {s}.archive_pending_embedding(execution_log, title, scope_and_content, admin_biographical_history,
                                      provenance);
DROP INDEX {s}.ix_documents_pending_ner;
CREATE INDEX ix_documents_pending_ner ON {s}.archive_documents (id)
  WHERE {s}.archive_pending_ner(status, execution_log, title, scope_and_content, admin_biographical_history,
                                provenance);
DROP INDEX {s}.ix_documents_pending_typology;
CREATE INDEX ix_documents_pending_typology ON {s}.archive_documents (id)
  WHERE {s}.archive_pending_typology(status, execution_log, title);
DROP INDEX {s}.ix_documents_pending_quality;
CREATE INDEX ix_documents_pending_quality ON {s}.archive_documents (id)
  WHERE {s}.archive_pending_quality(status, execution_log, title, scope_and_content, admin_biographical_history,
                                    provenance, date_text, date_start, date_end);
DROP INDEX {s}.ix_documents_pending_cleaning;
CREATE INDEX ix_documents_pending_cleaning ON {s}.archive_documents (id, cleaning_ruleset)
  WHERE {s}.archive_pending_cleaning_text(status, cleaning_text_stamp, title, scope_and_content,
                                          admin_biographical_history, provenance);
DROP INDEX {s}.ix_documents_stamp_errors;
CREATE INDEX ix_documents_stamp_errors ON {s}.archive_documents (id)
  WHERE {s}.archive_has_stamp_error(execution_log);
"""

# 0001's indexes, as they were (their predicates spelled out; the stamp functions already qualified by 0002).
OLD_INDEXES = """
DROP INDEX {s}.ix_documents_pending_embedding;
CREATE INDEX ix_documents_pending_embedding ON {s}.archive_documents (id)
  WHERE (execution_log #>> '{{embedding,stamp}}')
    IS DISTINCT FROM {s}.archive_text_stamp(title, scope_and_content, admin_biographical_history, provenance);
DROP INDEX {s}.ix_documents_pending_ner;
CREATE INDEX ix_documents_pending_ner ON {s}.archive_documents (id)
  WHERE status <> 'HUMAN_APPROVED' AND (execution_log #>> '{{ner,stamp}}')
    IS DISTINCT FROM {s}.archive_text_stamp(title, scope_and_content, admin_biographical_history, provenance);
DROP INDEX {s}.ix_documents_pending_typology;
CREATE INDEX ix_documents_pending_typology ON {s}.archive_documents (id)
  WHERE status <> 'HUMAN_APPROVED' AND (execution_log #>> '{{typology,stamp}}') IS DISTINCT FROM md5(title);
DROP INDEX {s}.ix_documents_pending_quality;
CREATE INDEX ix_documents_pending_quality ON {s}.archive_documents (id)
  WHERE status <> 'HUMAN_APPROVED' AND (execution_log #>> '{{quality-validator,stamp}}')
    IS DISTINCT FROM {s}.archive_quality_stamp(title, scope_and_content, admin_biographical_history, provenance,
                                               date_text, date_start, date_end, execution_log);
DROP INDEX {s}.ix_documents_pending_cleaning;
CREATE INDEX ix_documents_pending_cleaning ON {s}.archive_documents (id, cleaning_ruleset)
  WHERE status <> 'HUMAN_APPROVED' AND cleaning_text_stamp
    IS DISTINCT FROM {s}.archive_cleaning_text_stamp(title, scope_and_content, admin_biographical_history,
                                                     provenance);
DROP INDEX {s}.ix_documents_stamp_errors;
CREATE INDEX ix_documents_stamp_errors ON {s}.archive_documents (id)
  WHERE (jsonb_path_exists(execution_log, '$.*.status ? (@ == "ERROR")')
    OR jsonb_path_exists(execution_log, '$.cleaning.*.status ? (@ == "ERROR")'));
"""

DROP_FUNCTIONS = """
DROP FUNCTION {s}.archive_has_stamp_error(jsonb);
DROP FUNCTION {s}.archive_pending_cleaning_text({s}.document_status, text, text, text, text, text);
DROP FUNCTION {s}.archive_pending_quality({s}.document_status, jsonb, text, text, text, text, text, date, date);
DROP FUNCTION {s}.archive_pending_typology({s}.document_status, jsonb, text);
DROP FUNCTION {s}.archive_pending_ner({s}.document_status, jsonb, text, text, text, text);
DROP FUNCTION {s}.archive_pending_embedding(jsonb, text, text, text, text);
DROP FUNCTION {s}.archive_stamp_pending(jsonb, text, text);
"""

_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_composed_text'"
)


def _schema() -> str:
    return op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted


def upgrade() -> None:
    s = _schema()
    op.execute(FUNCTIONS.format(s=s))
    op.execute(INDEXES.format(s=s))


def downgrade() -> None:
    s = _schema()
    op.execute(OLD_INDEXES.format(s=s))
    op.execute(DROP_FUNCTIONS.format(s=s))
