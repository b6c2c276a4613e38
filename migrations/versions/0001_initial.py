"""The initial schema: the ledger-as-queue, the runner registry, schedules, settings, the archive and identity.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30

The DDL is written out as SQL so that a reviewer reads exactly what PostgreSQL runs; the metadata in
``scrinalia.db.tables`` mirrors it and ``alembic check`` (in the tests) proves that the two agree.
"""
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

ENUMS = """
CREATE TYPE worker_run_status AS ENUM ('QUEUED', 'RUNNING', 'SUCCESS', 'FAILED', 'INTERRUPTED', 'CANCELLED');
CREATE TYPE worker_run_trigger AS ENUM ('CLI', 'API', 'SCHEDULE');
CREATE TYPE user_role AS ENUM ('ADMIN', 'CURATOR', 'VIEWER');
CREATE TYPE document_status AS ENUM ('DRAFT', 'PUBLISHED', 'NEEDS_REVIEW', 'HUMAN_APPROVED');
CREATE TYPE cleaning_rule_kind AS ENUM ('REWRITE', 'VALIDATE', 'LLM_CHECK');
"""

# The fingerprint groups errors that differ only by their particulars. It must be IMMUTABLE to back a
# generated column, and each step runs in this order on purpose: uuids and paths before hashes, hashes
# before digit runs, because a path or a uuid contains digits and hex.
FINGERPRINT_FUNCTION = r"""
CREATE FUNCTION archive_error_fingerprint(err text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURNS NULL ON NULL INPUT
AS $fp$
SELECT left(
  regexp_replace(
    regexp_replace(
      regexp_replace(
        regexp_replace(
          lower(btrim(regexp_replace(split_part(err, E'\n', 1), '\s+', ' ', 'g'))),
          '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'g'),
        '(^|[\s''"(=:,\[])(~?/[^\s''"(),:\]]+)', '\1<path>', 'g'),
      '[0-9a-f]{16,}', '<hash>', 'g'),
    '[0-9]+', '<n>', 'g'),
  200)
$fp$;
"""

# The stamps of the document workers (issue #4, docs/workers.md). A document is pending for a worker when
# its recorded stamp differs from the stamp its current row would get; these IMMUTABLE functions compute
# that stamp in PostgreSQL, so an edited text re-queues the document by itself, and so the pending
# condition can be the predicate of a partial index (ix_documents_pending_*: a pending count is an
# index-only count whose cost grows with the backlog, not with the archive). Not STRICT, so they inline.
STAMP_FUNCTIONS = r"""
CREATE FUNCTION archive_composed_text(title text, scope_and_content text, history text, provenance text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $ct$
SELECT btrim(
  coalesce(btrim(title), '')
  || CASE WHEN coalesce(btrim(scope_and_content), '') = '' THEN '' ELSE E'\n\n' || btrim(scope_and_content) END
  || CASE WHEN coalesce(btrim(history), '') = '' THEN '' ELSE E'\n\n' || btrim(history) END
  || CASE WHEN coalesce(btrim(provenance), '') = '' THEN '' ELSE E'\n\n' || btrim(provenance) END)
$ct$;

CREATE FUNCTION archive_text_stamp(title text, scope_and_content text, history text, provenance text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $ts$
SELECT md5(archive_composed_text(title, scope_and_content, history, provenance))
$ts$;

CREATE FUNCTION archive_quality_stamp(title text, scope_and_content text, history text, provenance text,
                                      date_text text, date_start date, date_end date, execution_log jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $qs$
SELECT md5(archive_composed_text(title, scope_and_content, history, provenance)
  || chr(31) || coalesce(date_text, '')
  || chr(31) || coalesce((date_start - DATE '2000-01-01')::text, '')
  || chr(31) || coalesce((date_end - DATE '2000-01-01')::text, '')
  || chr(31) || coalesce(execution_log #>> '{ner,run_id}', '')
  || chr(31) || coalesce(execution_log #>> '{typology,run_id}', ''))
$qs$;

CREATE FUNCTION archive_cleaning_text_stamp(title text, scope_and_content text, history text, provenance text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $cts$
SELECT md5(coalesce('v' || title, 'n') || chr(31) || coalesce('v' || scope_and_content, 'n')
  || chr(31) || coalesce('v' || history, 'n') || chr(31) || coalesce('v' || provenance, 'n'))
$cts$;

CREATE FUNCTION archive_cleaning_rule_signature(field text, pattern text, replacement text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $crs$
SELECT md5(field || chr(31) || coalesce(pattern, '') || chr(31) || coalesce(replacement, ''))
$crs$;
"""

# The signature of the active REWRITE rule set (issue #4, decision 0027): md5 over the active rules' ids and
# signatures in id order (the order they apply in); NULL when no rule is active. A document's
# cleaning_ruleset records the value it was cleaned with; any change of the set (a rule added, edited,
# deactivated) changes it and re-queues every governed document once. STABLE (reads the rules table) and
# parallel-unsafe on purpose: the queue counts are small indexed reads that a Gather only slows down.
CLEANING_RULESET_FUNCTION = r"""
CREATE FUNCTION archive_cleaning_ruleset()
RETURNS text LANGUAGE sql STABLE
AS $crset$
SELECT md5(string_agg(r.id::text || ':' || archive_cleaning_rule_signature(r.field, r.pattern, r.replacement),
                      ',' ORDER BY r.id))
  FROM archive_cleaning_rules AS r
 WHERE r.kind = 'REWRITE' AND r.active
   AND r.field IN ('title', 'scope_and_content', 'admin_biographical_history', 'provenance')
$crset$;
"""

TABLES = """
CREATE TABLE archive_cleaning_rules (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	name TEXT NOT NULL,
	kind cleaning_rule_kind NOT NULL,
	field TEXT DEFAULT 'title' NOT NULL,
	pattern TEXT,
	replacement TEXT,
	message TEXT,
	engine_name TEXT,
	engine_options JSONB DEFAULT '{}'::jsonb NOT NULL,
	prompt TEXT,
	active BOOLEAN DEFAULT true NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (name)
);

CREATE UNIQUE INDEX uq_cleaning_rule_active_llm_check ON archive_cleaning_rules (kind)
  WHERE kind = 'LLM_CHECK' AND active;

CREATE TABLE archive_documents (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	reference_code TEXT NOT NULL,
	title TEXT DEFAULT '' NOT NULL,
	scope_and_content TEXT,
	admin_biographical_history TEXT,
	provenance TEXT,
	date_text TEXT,
	date_start DATE,
	date_end DATE,
	level TEXT,
	extent TEXT,
	language TEXT,
	creator TEXT,
	status document_status DEFAULT 'DRAFT' NOT NULL,
	is_anomaly BOOLEAN DEFAULT false NOT NULL,
	anomaly_reasons JSONB DEFAULT '[]'::jsonb NOT NULL,
	execution_log JSONB DEFAULT '{}'::jsonb NOT NULL,
	cleaning_ruleset TEXT,
	cleaning_text_stamp TEXT,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (reference_code),
	CONSTRAINT ck_documents_cleaning_record CHECK ((cleaning_ruleset IS NULL) = (cleaning_text_stamp IS NULL))
);

CREATE INDEX ix_documents_status ON archive_documents (status);

CREATE INDEX ix_documents_title_normalized ON archive_documents (lower(btrim(title)));

CREATE INDEX ix_documents_pending_embedding ON archive_documents (id)
  WHERE (execution_log #>> '{embedding,stamp}')
    IS DISTINCT FROM archive_text_stamp(title, scope_and_content, admin_biographical_history, provenance);

CREATE INDEX ix_documents_pending_ner ON archive_documents (id)
  WHERE status <> 'HUMAN_APPROVED' AND (execution_log #>> '{ner,stamp}')
    IS DISTINCT FROM archive_text_stamp(title, scope_and_content, admin_biographical_history, provenance);

CREATE INDEX ix_documents_pending_typology ON archive_documents (id)
  WHERE status <> 'HUMAN_APPROVED' AND (execution_log #>> '{typology,stamp}') IS DISTINCT FROM md5(title);

CREATE INDEX ix_documents_pending_quality ON archive_documents (id)
  WHERE status <> 'HUMAN_APPROVED' AND (execution_log #>> '{quality-validator,stamp}')
    IS DISTINCT FROM archive_quality_stamp(title, scope_and_content, admin_biographical_history, provenance,
                                           date_text, date_start, date_end, execution_log);

CREATE INDEX ix_documents_pending_cleaning ON archive_documents (id, cleaning_ruleset)
  WHERE status <> 'HUMAN_APPROVED' AND cleaning_text_stamp
    IS DISTINCT FROM archive_cleaning_text_stamp(title, scope_and_content, admin_biographical_history, provenance);

CREATE INDEX ix_documents_cleaning_ruleset ON archive_documents (cleaning_ruleset) INCLUDE (status);

CREATE INDEX ix_documents_stamp_errors ON archive_documents (id)
  WHERE (jsonb_path_exists(execution_log, '$.*.status ? (@ == "ERROR")')
    OR jsonb_path_exists(execution_log, '$.cleaning.*.status ? (@ == "ERROR")'));

CREATE TABLE archive_entities (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	label TEXT NOT NULL,
	name TEXT NOT NULL,
	normalized_name TEXT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_entity_label_name UNIQUE (label, normalized_name),
	CONSTRAINT ck_entity_label CHECK (label IN ('PER', 'ORG', 'LOC', 'MISC'))
);

CREATE TABLE archive_entity_exclusions (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	label TEXT,
	term TEXT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_entity_exclusion UNIQUE (label, term)
);

CREATE TABLE archive_entity_stopwords (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	term TEXT NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (term)
);

CREATE TABLE archive_typologies (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	name TEXT NOT NULL,
	description TEXT,
	active BOOLEAN DEFAULT true NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (name)
);

CREATE TABLE archive_worker_runners (
	runner_id UUID NOT NULL,
	name TEXT NOT NULL,
	kind TEXT DEFAULT 'daemon' NOT NULL,
	hostname TEXT NOT NULL,
	pid INTEGER NOT NULL,
	package_version TEXT NOT NULL,
	schema_revision TEXT,
	capabilities TEXT[] DEFAULT '{}'::text[] NOT NULL,
	concurrency INTEGER DEFAULT 1 NOT NULL,
	heartbeat_seconds FLOAT NOT NULL,
	lease_seconds FLOAT NOT NULL,
	poll_seconds FLOAT,
	devices JSONB DEFAULT '[]'::jsonb NOT NULL,
	children JSONB DEFAULT '[]'::jsonb NOT NULL,
	started_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	last_heartbeat_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	stopped_at TIMESTAMP WITH TIME ZONE,
	drain_requested_at TIMESTAMP WITH TIME ZONE,
	drain_requested_by TEXT,
	PRIMARY KEY (runner_id),
	CONSTRAINT ck_runner_lease_exceeds_heartbeat CHECK (lease_seconds > heartbeat_seconds),
	CONSTRAINT ck_runner_concurrency_positive CHECK (concurrency >= 1)
);

CREATE INDEX ix_runners_last_heartbeat ON archive_worker_runners (last_heartbeat_at);

CREATE TABLE archive_worker_schedules (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	worker_name VARCHAR(100) NOT NULL,
	interval_seconds INTEGER NOT NULL,
	request JSONB DEFAULT '{}'::jsonb NOT NULL,
	enabled BOOLEAN DEFAULT true NOT NULL,
	next_run_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	last_tick_at TIMESTAMP WITH TIME ZONE,
	last_run_id UUID,
	last_outcome TEXT,
	created_by TEXT,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT ck_schedule_interval_min CHECK (interval_seconds >= 60),
	CONSTRAINT ck_schedule_request_object CHECK (jsonb_typeof(request) = 'object')
);

CREATE INDEX ix_schedules_due ON archive_worker_schedules (next_run_at) WHERE enabled;

CREATE TABLE archive_worker_setting_revisions (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	worker_name VARCHAR(100) NOT NULL,
	revision INTEGER NOT NULL,
	action TEXT NOT NULL,
	settings JSONB,
	changed_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	changed_by TEXT,
	PRIMARY KEY (id),
	CONSTRAINT uq_setting_revision UNIQUE (worker_name, revision),
	CONSTRAINT ck_setting_revision_action CHECK (action IN ('PUT', 'DELETE'))
);

CREATE TABLE archive_worker_settings (
	worker_name VARCHAR(100) NOT NULL,
	engine_name TEXT,
	preset TEXT,
	db_batch_size INTEGER,
	options JSONB DEFAULT '{}'::jsonb NOT NULL,
	engine_options JSONB DEFAULT '{}'::jsonb NOT NULL,
	revision INTEGER DEFAULT 1 NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	updated_by TEXT,
	PRIMARY KEY (worker_name)
);

CREATE TABLE auth_users (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	email TEXT NOT NULL,
	password_hash TEXT NOT NULL,
	role user_role DEFAULT 'VIEWER' NOT NULL,
	is_active BOOLEAN DEFAULT true NOT NULL,
	must_change_password BOOLEAN DEFAULT false NOT NULL,
	failed_attempts INTEGER DEFAULT 0 NOT NULL,
	lockout_count INTEGER DEFAULT 0 NOT NULL,
	locked_until TIMESTAMP WITH TIME ZONE,
	last_login_at TIMESTAMP WITH TIME ZONE,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (id)
);

CREATE UNIQUE INDEX uq_auth_users_email ON auth_users (lower(email));

CREATE TABLE archive_document_embeddings (
	document_id BIGINT NOT NULL,
	model TEXT NOT NULL,
	dimensions INTEGER NOT NULL,
	vector REAL[] NOT NULL,
	text_md5 TEXT NOT NULL,
	run_id UUID,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (document_id),
	FOREIGN KEY(document_id) REFERENCES archive_documents (id) ON DELETE CASCADE
);

CREATE TABLE archive_document_entities (
	document_id BIGINT NOT NULL,
	entity_id BIGINT NOT NULL,
	score FLOAT,
	mentions INTEGER DEFAULT 1 NOT NULL,
	run_id UUID,
	PRIMARY KEY (document_id, entity_id),
	FOREIGN KEY(document_id) REFERENCES archive_documents (id) ON DELETE CASCADE,
	FOREIGN KEY(entity_id) REFERENCES archive_entities (id) ON DELETE CASCADE
);

CREATE INDEX ix_document_entities_entity ON archive_document_entities (entity_id);

CREATE TABLE archive_document_typologies (
	document_id BIGINT NOT NULL,
	typology_id BIGINT NOT NULL,
	score FLOAT NOT NULL,
	run_id UUID,
	PRIMARY KEY (document_id, typology_id),
	FOREIGN KEY(document_id) REFERENCES archive_documents (id) ON DELETE CASCADE,
	FOREIGN KEY(typology_id) REFERENCES archive_typologies (id) ON DELETE CASCADE
);

CREATE TABLE archive_review_queue (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	document_id BIGINT NOT NULL,
	reason TEXT NOT NULL,
	details JSONB DEFAULT '{}'::jsonb NOT NULL,
	source_run_id UUID,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	resolved_at TIMESTAMP WITH TIME ZONE,
	resolved_by TEXT,
	PRIMARY KEY (id),
	FOREIGN KEY(document_id) REFERENCES archive_documents (id) ON DELETE CASCADE
);

CREATE UNIQUE INDEX uq_review_open_per_document ON archive_review_queue (document_id) WHERE resolved_at IS NULL;

CREATE TABLE archive_worker_runs (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	run_id UUID DEFAULT gen_random_uuid() NOT NULL,
	worker_name VARCHAR(100) NOT NULL,
	status worker_run_status DEFAULT 'QUEUED' NOT NULL,
	trigger worker_run_trigger NOT NULL,
	requested_by TEXT,
	requested_by_user_id BIGINT,
	request JSONB NOT NULL,
	engine_name TEXT,
	preset TEXT,
	config JSONB,
	options JSONB,
	queued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	started_at TIMESTAMP WITH TIME ZONE,
	finished_at TIMESTAMP WITH TIME ZONE,
	duration_ms BIGINT,
	runner_id UUID,
	heartbeat_at TIMESTAMP WITH TIME ZONE,
	lease_expires_at TIMESTAMP WITH TIME ZONE,
	attempt INTEGER DEFAULT 1 NOT NULL,
	retry_of UUID,
	not_before TIMESTAMP WITH TIME ZONE,
	schedule_id BIGINT,
	cancel_requested_at TIMESTAMP WITH TIME ZONE,
	cancel_requested_by TEXT,
	error TEXT,
	error_fingerprint TEXT GENERATED ALWAYS AS (archive_error_fingerprint(error)) STORED,
	exit_code INTEGER,
	exit_signal INTEGER,
	exit_reason TEXT,
	progress JSONB,
	metrics JSONB,
	result JSONB,
	PRIMARY KEY (id),
	CONSTRAINT ck_run_worker_name_not_empty CHECK (char_length(worker_name) >= 1),
	CONSTRAINT ck_run_request_object CHECK (jsonb_typeof(request) = 'object'),
	CONSTRAINT ck_run_error_length CHECK (char_length(error) <= 2000),
	CONSTRAINT ck_run_exit_reason
		CHECK (exit_reason IN ('exception', 'signal', 'oom', 'timeout', 'lease-lost', 'runner-stopped', 'cancelled',
			'cancel-forced')),
	CONSTRAINT ck_run_attempt_positive CHECK (attempt >= 1),
	UNIQUE (run_id),
	FOREIGN KEY(requested_by_user_id) REFERENCES auth_users (id) ON DELETE SET NULL,
	FOREIGN KEY(runner_id) REFERENCES archive_worker_runners (runner_id),
	FOREIGN KEY(retry_of) REFERENCES archive_worker_runs (run_id),
	FOREIGN KEY(schedule_id) REFERENCES archive_worker_schedules (id) ON DELETE SET NULL
);

CREATE INDEX ix_worker_runs_claim ON archive_worker_runs (queued_at, id) WHERE status = 'QUEUED';

CREATE INDEX ix_worker_runs_fingerprint ON archive_worker_runs (error_fingerprint, finished_at)
  WHERE error_fingerprint IS NOT NULL;

CREATE INDEX ix_worker_runs_lease ON archive_worker_runs (lease_expires_at) WHERE status = 'RUNNING';

CREATE INDEX ix_worker_runs_retry_of ON archive_worker_runs (retry_of) WHERE retry_of IS NOT NULL;

CREATE INDEX ix_worker_runs_runner ON archive_worker_runs (runner_id) WHERE status = 'RUNNING';

CREATE INDEX ix_worker_runs_worker_id ON archive_worker_runs (worker_name, id DESC);

CREATE INDEX ix_worker_runs_status_id ON archive_worker_runs (status, id DESC);

CREATE INDEX ix_worker_runs_fingerprint_id ON archive_worker_runs (error_fingerprint, id DESC)
  WHERE error_fingerprint IS NOT NULL;

CREATE INDEX ix_worker_runs_failures ON archive_worker_runs (finished_at) WHERE error_fingerprint IS NOT NULL;

CREATE UNIQUE INDEX uq_worker_run_active ON archive_worker_runs (worker_name) WHERE status IN ('QUEUED', 'RUNNING');

CREATE TABLE auth_sessions (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	token_sha256 TEXT NOT NULL,
	csrf_token TEXT NOT NULL,
	user_id BIGINT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	last_seen_at TIMESTAMP WITH TIME ZONE,
	revoked_at TIMESTAMP WITH TIME ZONE,
	client_address TEXT,
	user_agent TEXT,
	PRIMARY KEY (id),
	UNIQUE (token_sha256),
	FOREIGN KEY(user_id) REFERENCES auth_users (id) ON DELETE CASCADE
);

CREATE INDEX ix_auth_sessions_user ON auth_sessions (user_id);
"""


def upgrade() -> None:
    op.execute(ENUMS)
    op.execute(FINGERPRINT_FUNCTION)
    op.execute(STAMP_FUNCTIONS)
    op.execute(TABLES)
    op.execute(CLEANING_RULESET_FUNCTION)


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE IF EXISTS archive_review_queue, archive_cleaning_rules, archive_document_typologies,
            archive_typologies, archive_entity_exclusions, archive_entity_stopwords,
            archive_document_entities, archive_entities, archive_document_embeddings,
            archive_documents, archive_worker_runs, archive_worker_setting_revisions,
            archive_worker_settings, archive_worker_schedules, archive_worker_runners,
            auth_sessions, auth_users;
        DROP FUNCTION IF EXISTS archive_error_fingerprint(text);
        DROP FUNCTION IF EXISTS archive_cleaning_ruleset();
        DROP FUNCTION IF EXISTS archive_cleaning_rule_signature(text, text, text);
        DROP FUNCTION IF EXISTS archive_cleaning_text_stamp(text, text, text, text);
        DROP FUNCTION IF EXISTS archive_quality_stamp(text, text, text, text, text, date, date, jsonb);
        DROP FUNCTION IF EXISTS archive_text_stamp(text, text, text, text);
        DROP FUNCTION IF EXISTS archive_composed_text(text, text, text, text);
        DROP TYPE IF EXISTS cleaning_rule_kind, document_status, user_role, worker_run_trigger,
            worker_run_status;
        """
    )
