"""The schema as SQLAlchemy Core metadata.

Alembic's migrations are the only way the schema changes; this metadata mirrors what they create so
that ``alembic check`` can prove the two agree, and so that queries outside the protocol's hot path can
use Core constructs. The protocol's own statements are written as visible SQL in the ledger module.
"""
from __future__ import annotations

from enum import StrEnum

from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    Date,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = MetaData()

WORKER_NAME_MAX = 100
ERROR_MAX = 2000

RUN_STATUSES = ("QUEUED", "RUNNING", "SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED")
ACTIVE_STATUSES = ("QUEUED", "RUNNING")
TERMINAL_STATUSES = ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED")
RARE_ENDINGS = ("FAILED", "INTERRUPTED", "CANCELLED")  # the endings ix_worker_runs_ending_id holds (0020)
RUN_TRIGGERS = ("CLI", "API", "SCHEDULE", "PANEL")  # PANEL: migration 0017


class ExitReason(StrEnum):
    """Why a run ended (``archive_worker_runs.exit_reason``): ONE vocabulary for the two places that decide
    a run's end. The runner's parent decides most of them (``runner.finisher.Finisher`` through
    ``runner.outcome.decide``); two protocol statements of the ledger decide the others in SQL, each
    naming its reason from here (``SQL_DECIDED_EXIT_REASONS``). docs/architecture.md has the table."""

    EXCEPTION = "exception"            # the worker raised (or the child exited without a result)
    SIGNAL = "signal"                  # a signal killed the child (not one the runner sent for a reason)
    OOM = "oom"                        # the kernel's OOM killer (the cgroup's oom_kill counter moved)
    TIMEOUT = "timeout"                # over --max-runtime
    LEASE_LOST = "lease-lost"          # the lease ended before the run did (SQL: expire_leases)
    RUNNER_STOPPED = "runner-stopped"  # the runner stopped (drain timeout, operator interrupt)
    CANCELLED = "cancelled"            # cancelled at a batch boundary (SQL: request_cancel of a QUEUED run)
    CANCEL_FORCED = "cancel-forced"    # did not stop within --cancel-grace of the request
    CONFIGURATION = "configuration"    # the request does not resolve / the engine cannot load: never retried
    CUDA_ERROR = "cuda-error"          # migration 0004: a CUDA error (device-side assert, illegal access, ...)
    CUDA_OOM = "cuda-oom"              # migration 0004: CUDA out of memory (not the kernel's OOM killer)
    STALLED = "stalled"                # migration 0011: no message and no CPU work for the stall timeout


EXIT_REASONS = tuple(reason.value for reason in ExitReason)
# The statements of the ledger that end a run in SQL, and the reason each writes.
SQL_DECIDED_EXIT_REASONS = {"expire_leases": ExitReason.LEASE_LOST, "request_cancel": ExitReason.CANCELLED}

USER_ROLES = ("ADMIN", "CURATOR", "VIEWER")
DOCUMENT_STATUSES = ("DRAFT", "PUBLISHED", "NEEDS_REVIEW", "HUMAN_APPROVED")
CLEANING_RULE_KINDS = ("REWRITE", "VALIDATE", "LLM_CHECK")
ENTITY_LABELS = ("PER", "ORG", "LOC", "MISC")

run_status = Enum(*RUN_STATUSES, name="worker_run_status")
run_trigger = Enum(*RUN_TRIGGERS, name="worker_run_trigger")
user_role = Enum(*USER_ROLES, name="user_role")
document_status = Enum(*DOCUMENT_STATUSES, name="document_status")
cleaning_rule_kind = Enum(*CLEANING_RULE_KINDS, name="cleaning_rule_kind")

TS = DateTime(timezone=True)

# --- identity -------------------------------------------------------------------------------------

auth_users = Table(
    "auth_users",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("email", Text, nullable=False),
    Column("password_hash", Text, nullable=False),
    Column("role", user_role, nullable=False, server_default="VIEWER"),
    Column("is_active", Boolean, nullable=False, server_default=text("true")),
    Column("must_change_password", Boolean, nullable=False, server_default=text("false")),
    # The previous release's lockout, kept for it until the next release's contract step (migration 0005,
    # decision 0125): this code never reads them; what that release writes is carried into
    # auth_login_throttle by a trigger.
    Column("failed_attempts", Integer, nullable=False, server_default=text("0")),
    Column("lockout_count", Integer, nullable=False, server_default=text("0")),
    Column("locked_until", TS),
    Column("last_login_at", TS),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    Index("uq_auth_users_email", func.lower(text("email")), unique=True),
)

auth_sessions = Table(
    "auth_sessions",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("token_sha256", Text, nullable=False, unique=True),
    Column("csrf_token", Text, nullable=False),
    Column("user_id", BigInteger, ForeignKey("auth_users.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("expires_at", TS, nullable=False),
    Column("last_seen_at", TS),
    Column("revoked_at", TS),
    Column("client_address", Text),
    Column("user_agent", Text),
    Index("ix_auth_sessions_user", "user_id"),
)

# Login attempts (migration 0005): one bucket per account (SHA-256 of the normalised e-mail, known or
# not) or per trusted device, claimed before a password is checked (docs/security.md).
auth_login_throttle = Table(
    "auth_login_throttle",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("key_sha256", Text, primary_key=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("lockout_count", Integer, nullable=False, server_default=text("0")),
    Column("locked_until", TS),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    CheckConstraint("scope IN ('account', 'device')", name="ck_auth_login_throttle_scope"),
    Index("ix_auth_login_throttle_updated", "updated_at"),
)

auth_devices = Table(
    "auth_devices",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("token_sha256", Text, nullable=False, unique=True),
    Column("user_id", BigInteger, ForeignKey("auth_users.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("expires_at", TS, nullable=False),
    Index("ix_auth_devices_user", "user_id"),
)

# --- the runner registry --------------------------------------------------------------------------

archive_worker_runners = Table(
    "archive_worker_runners",
    metadata,
    Column("runner_id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("kind", Text, nullable=False, server_default="daemon"),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("package_version", Text, nullable=False),
    Column("schema_revision", Text),
    Column("capabilities", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("concurrency", Integer, nullable=False, server_default=text("1")),
    Column("heartbeat_seconds", Float, nullable=False),
    Column("lease_seconds", Float, nullable=False),
    Column("poll_seconds", Float),
    Column("devices", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("children", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    # What the runner sees on its host (migration 0014): {"model_dirs": [...], "model_roots": [...]}.
    Column("sees", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # The fork server's warm models, written by the heartbeat when they change (migration 0019):
    # {"models": [{model_class, model_dir, dtype, bytes, workers}], "bytes": ..., "limit_bytes": ...}.
    Column("warm", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("started_at", TS, nullable=False, server_default=func.now()),
    Column("last_heartbeat_at", TS, nullable=False, server_default=func.now()),
    Column("stopped_at", TS),
    Column("drain_requested_at", TS),
    Column("drain_requested_by", Text),
    CheckConstraint("lease_seconds > heartbeat_seconds", name="ck_runner_lease_exceeds_heartbeat"),
    CheckConstraint("concurrency >= 1", name="ck_runner_concurrency_positive"),
    # No index on last_heartbeat_at (migration 0003): every heartbeat changes it, and an index on it
    # would make each beat a non-HOT update.
)

# --- schedules and settings ------------------------------------------------------------------------

archive_worker_schedules = Table(
    "archive_worker_schedules",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("worker_name", String(WORKER_NAME_MAX), nullable=False),
    Column("interval_seconds", Integer, nullable=False),
    Column("request", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("next_run_at", TS, nullable=False, server_default=func.now()),
    Column("last_tick_at", TS),
    Column("last_run_id", UUID(as_uuid=True)),
    Column("last_outcome", Text),
    Column("created_by", Text),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    # Crash-loop quarantine (migration 0016, decision 0165): set with enabled = false by the scheduler.
    Column("quarantined_at", TS),
    Column("quarantine_reason", Text),
    Column("quarantine_fingerprint", Text),
    Column("quarantine_run_id", UUID(as_uuid=True)),
    Column("quarantine_resumed_at", TS),
    Column("quarantine_resumed_by", Text),
    CheckConstraint("interval_seconds >= 60", name="ck_schedule_interval_min"),
    CheckConstraint("jsonb_typeof(request) = 'object'", name="ck_schedule_request_object"),
    Index("ix_schedules_due", "next_run_at", postgresql_where=text("enabled")),
)

archive_worker_settings = Table(
    "archive_worker_settings",
    metadata,
    Column("worker_name", String(WORKER_NAME_MAX), primary_key=True),
    Column("engine_name", Text),
    Column("preset", Text),
    Column("db_batch_size", Integer),
    Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("engine_options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("revision", Integer, nullable=False, server_default=text("1")),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    Column("updated_by", Text),
)

archive_worker_setting_revisions = Table(
    "archive_worker_setting_revisions",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("worker_name", String(WORKER_NAME_MAX), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("action", Text, nullable=False),
    Column("settings", JSONB),
    Column("changed_at", TS, nullable=False, server_default=func.now()),
    Column("changed_by", Text),
    UniqueConstraint("worker_name", "revision", name="uq_setting_revision"),
    CheckConstraint("action IN ('PUT', 'DELETE')", name="ck_setting_revision_action"),
)

# --- the ledger (and the queue) --------------------------------------------------------------------


def _status_in(statuses: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


#: The predicates of the two partial indexes that hold a status's rows (the slot; the rare endings): the
#: runs list restates a filter within one of them so that any plan may read that index (decision 0391).
ACTIVE_PREDICATE = _status_in(ACTIVE_STATUSES)
RARE_ENDING_PREDICATE = _status_in(RARE_ENDINGS)
_quoted_reasons = ", ".join(f"'{r}'" for r in EXIT_REASONS)

archive_worker_runs = Table(
    "archive_worker_runs",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    # Time-ordered (UUIDv7, made by the database: migration 0003), so inserts append to the index.
    Column("run_id", UUID(as_uuid=True), nullable=False, unique=True,
           server_default=text("archive_uuid_v7()")),
    Column("worker_name", String(WORKER_NAME_MAX), nullable=False),
    Column("status", run_status, nullable=False, server_default="QUEUED"),
    Column("trigger", run_trigger, nullable=False),
    Column("requested_by", Text),
    Column("requested_by_user_id", BigInteger, ForeignKey("auth_users.id", ondelete="SET NULL")),
    Column("request", JSONB, nullable=False),
    Column("engine_name", Text),
    Column("preset", Text),
    Column("config", JSONB),
    Column("options", JSONB),
    Column("queued_at", TS, nullable=False, server_default=func.now()),
    Column("started_at", TS),
    Column("finished_at", TS),
    Column("duration_ms", BigInteger),
    Column("runner_id", UUID(as_uuid=True), ForeignKey("archive_worker_runners.runner_id")),
    Column("heartbeat_at", TS),
    Column("lease_expires_at", TS),
    Column("attempt", Integer, nullable=False, server_default=text("1")),
    Column("retry_of", UUID(as_uuid=True), ForeignKey("archive_worker_runs.run_id")),
    Column("not_before", TS),
    Column("schedule_id", BigInteger,
           ForeignKey("archive_worker_schedules.id", ondelete="SET NULL")),
    Column("cancel_requested_at", TS),
    Column("cancel_requested_by", Text),
    Column("error", Text),
    Column("error_fingerprint", Text, Computed("archive_error_fingerprint(error)", persisted=True)),
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    Column("exit_reason", Text),
    Column("progress", JSONB),
    Column("metrics", JSONB),
    Column("result", JSONB),
    CheckConstraint("char_length(worker_name) >= 1", name="ck_run_worker_name_not_empty"),
    CheckConstraint("jsonb_typeof(request) = 'object'", name="ck_run_request_object"),
    CheckConstraint(f"char_length(error) <= {ERROR_MAX}", name="ck_run_error_length"),
    CheckConstraint(f"exit_reason IN ({_quoted_reasons})", name="ck_run_exit_reason"),
    CheckConstraint("attempt >= 1", name="ck_run_attempt_positive"),
    # One slot per worker: the queue is a slot, not a backlog (docs/protocol.md). It holds exactly the
    # active rows (at most one per worker), so the claim reads it whatever the history (migration 0003
    # dropped the separate QUEUED and lease indexes: one index entry fewer per enqueue and per claim).
    Index("uq_worker_run_active", "worker_name", unique=True,
          postgresql_where=text(ACTIVE_PREDICATE)),
    # Lease expiry and the heartbeat read only RUNNING rows.
    Index("ix_worker_runs_runner", "runner_id", postgresql_where=text("status = 'RUNNING'")),
    # Last run per worker, the runs list and its filters (keyset on id).
    Index("ix_worker_runs_worker_id", "worker_name", text("id DESC")),
    Index("ix_worker_runs_fingerprint", "error_fingerprint", "finished_at",
          postgresql_where=text("error_fingerprint IS NOT NULL")),
    Index("ix_worker_runs_retry_of", "retry_of", postgresql_where=text("retry_of IS NOT NULL")),
    # The runs list filtered by a rare ending, keyset-paginated on id (GET /system/runs). Only those rows:
    # an active status is the slot index's, SUCCESS most of the history (migration 0020, decision 0391).
    Index("ix_worker_runs_ending_id", "status", text("id DESC"),
          postgresql_where=text(RARE_ENDING_PREDICATE)),
    # The runs list filtered by fingerprint, keyset-paginated on id.
    Index("ix_worker_runs_fingerprint_id", "error_fingerprint", text("id DESC"),
          postgresql_where=text("error_fingerprint IS NOT NULL")),
    # The failures screen: errors of the last N days (GET /system/failures).
    Index("ix_worker_runs_failures", "finished_at", postgresql_where=text("error_fingerprint IS NOT NULL")),
    # The panel's trend charts (migration 0015): runs per hour and durations per worker, slots busy per
    # runner. Finished rows only, so an enqueue or a claim adds no entry.
    Index("ix_worker_runs_worker_finished", "worker_name", "finished_at",
          postgresql_include=["status", "duration_ms"], postgresql_where=text("finished_at IS NOT NULL")),
    Index("ix_worker_runs_runner_finished", "runner_id", "finished_at", postgresql_include=["started_at"],
          postgresql_where=text("finished_at IS NOT NULL AND runner_id IS NOT NULL")),
    # A schedule's latest runs, for the quarantine check (migration 0016): scheduled rows only.
    Index("ix_worker_runs_schedule_id", "schedule_id", text("id DESC"),
          postgresql_where=text("schedule_id IS NOT NULL AND trigger = 'SCHEDULE'")),
)

# What a runner reports of its host: its devices and the model directories it sees (written by register),
# its warm models (by the heartbeat, when they change); migration 0023, decision 0395. Out of the registry's
# row, which the heartbeat rewrites at every beat; readers take this row's, then the registry row's.
archive_worker_runner_reports = Table(
    "archive_worker_runner_reports",
    metadata,
    Column("runner_id", UUID(as_uuid=True), ForeignKey("archive_worker_runners.runner_id", ondelete="CASCADE"),
           primary_key=True),
    Column("devices", JSONB),
    Column("sees", JSONB),
    Column("warm", JSONB),
)

# A run's resolved configuration, written once by record_start (migration 0022, decision 0394): out of the
# run's row, which the heartbeat and the progress rewrite all the run's life. A run the previous release
# started keeps it in the row's own config and options; readers take the row's, then this one.
archive_worker_run_configs = Table(
    "archive_worker_run_configs",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("archive_worker_runs.run_id", ondelete="CASCADE"),
           primary_key=True),
    Column("config", JSONB),
    Column("options", JSONB),
)

# A run's chart over its life (migration 0015, decision 0160): filled by triggers on the run row's
# progress and on the registry's children snapshot; pruned by the scheduler after the retention.
archive_worker_run_samples = Table(
    "archive_worker_run_samples",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("at", TS, nullable=False, server_default=func.now()),
    Column("done", BigInteger),
    Column("total", BigInteger),
    Column("rss_bytes", BigInteger),
    Column("gpu_bytes", BigInteger),
    Index("ix_run_samples_run_at", "run_id", "at"),
)

# Finished runs per worker and final status, and the histogram of their durations (cumulative counts
# per bound of archive_run_duration_bounds()), of the runs that ended before the watermark below (kept by a
# trigger until migration 0018, folded in by the scrape since: decisions 0166, 0370); read by /metrics.
archive_run_totals = Table(
    "archive_run_totals",
    metadata,
    Column("worker_name", String(WORKER_NAME_MAX), primary_key=True),
    Column("status", run_status, primary_key=True),
    Column("runs", BigInteger, nullable=False, server_default=text("0")),
    Column("timed", BigInteger, nullable=False, server_default=text("0")),
    Column("duration_seconds_sum", Float, nullable=False, server_default=text("0")),
    Column("duration_buckets", ARRAY(BigInteger), nullable=False),
)

# The totals count the runs that ended before ``folded_before``; /metrics adds those ended since
# (``archive_run_totals_now()``) and its scrape folds them in (``archive_run_totals_fold()``, migration
# 0018, decision 0370). One row.
archive_run_totals_watermark = Table(
    "archive_run_totals_watermark",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("folded_before", TS, nullable=False),
    Column("folded_at", TS, nullable=False),
    CheckConstraint("one", name="archive_run_totals_watermark_one_check"),
)

# --- the archive -----------------------------------------------------------------------------------

archive_documents = Table(
    "archive_documents",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("reference_code", Text, nullable=False, unique=True),
    Column("title", Text, nullable=False, server_default=""),
    Column("scope_and_content", Text),
    Column("admin_biographical_history", Text),
    Column("provenance", Text),
    Column("date_text", Text),
    Column("date_start", Date),
    Column("date_end", Date),
    Column("level", Text),
    Column("extent", Text),
    Column("language", Text),
    Column("creator", Text),
    Column("status", document_status, nullable=False, server_default="DRAFT"),
    Column("is_anomaly", Boolean, nullable=False, server_default=text("false")),
    Column("anomaly_reasons", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    # Per-worker stamps: {"<stamp key>": {"stamp": ..., "status": "DONE"|"ERROR", "run_id": ..., "at": ...}}.
    Column("execution_log", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # The cleaning worker's record (decision 0027): the active REWRITE rule set's signature
    # (archive_cleaning_ruleset()) and archive_cleaning_text_stamp(...) of the four fields, at cleaning time.
    Column("cleaning_ruleset", Text),
    Column("cleaning_text_stamp", Text),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    Index("ix_documents_status", "status"),
    # The document workers' queues (scrinalia/domains/archive/workers/stamps.py): one partial index per
    # stamp key whose predicate is the worker's pending condition, so a pending count is index-only.
    Index("ix_documents_title_normalized", func.lower(func.btrim(text("title")))),
    # The predicates are the SQL functions of migration 0009, which the workers' queries call too.
    Index("ix_documents_pending_embedding", "id", postgresql_where=text(
        "archive_pending_embedding(execution_log, title, scope_and_content, admin_biographical_history, provenance)")),
    Index("ix_documents_pending_ner", "id", postgresql_where=text(
        "archive_pending_ner(status, execution_log, title, scope_and_content, admin_biographical_history, "
        "provenance)")),
    Index("ix_documents_pending_typology", "id", postgresql_where=text(
        "archive_pending_typology(status, execution_log, title)")),
    Index("ix_documents_pending_quality", "id", postgresql_where=text(
        "archive_pending_quality(status, execution_log, title, scope_and_content, admin_biographical_history, "
        "provenance, date_text, date_start, date_end)")),
    # cleaning: pending = governed AND (text changed since cleaning [this partial index] OR cleaning_ruleset
    # differs from the current rule set's signature [range scans on ix_documents_cleaning_ruleset]).
    Index("ix_documents_pending_cleaning", "id", "cleaning_ruleset", postgresql_where=text(
        "archive_pending_cleaning_text(status, cleaning_text_stamp, title, scope_and_content, "
        "admin_biographical_history, provenance)")),
    Index("ix_documents_cleaning_ruleset", "cleaning_ruleset", postgresql_include=["status"]),
    # Written together (cleaning.py), so "cleaning_ruleset IS NULL" is covered by the text-changed arm.
    CheckConstraint("(cleaning_ruleset IS NULL) = (cleaning_text_stamp IS NULL)", name="ck_documents_cleaning_record"),
    Index("ix_documents_stamp_errors", "id", postgresql_where=text("archive_has_stamp_error(execution_log)")),
)

# The document workers' queue counts, kept by statement-level triggers on archive_documents (migration
# 0010, decision 0075): the sum of n over a group is the number of documents in that state. Insert-only for
# writers (signed deltas), folded now and then; read by GET /system/workers (stamp_summary.py).
archive_stamp_counts = Table(
    "archive_stamp_counts",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("stamp_key", Text, nullable=False),
    Column("governed", Boolean, nullable=False),
    Column("stale", Boolean, nullable=False),
    Column("failed", Boolean, nullable=False),
    Column("ruleset", Text, nullable=False, server_default=text("''")),
    Column("n", BigInteger, nullable=False),
)

archive_document_embeddings = Table(
    "archive_document_embeddings",
    metadata,
    Column("document_id", BigInteger, ForeignKey("archive_documents.id", ondelete="CASCADE"),
           primary_key=True),
    Column("model", Text, nullable=False),
    Column("dimensions", Integer, nullable=False),
    Column("vector", ARRAY(REAL), nullable=False),
    Column("text_md5", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True)),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
)

archive_entities = Table(
    "archive_entities",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("label", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("normalized_name", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    UniqueConstraint("label", "normalized_name", name="uq_entity_label_name"),
    CheckConstraint("label IN ('PER', 'ORG', 'LOC', 'MISC')", name="ck_entity_label"),
)

archive_document_entities = Table(
    "archive_document_entities",
    metadata,
    Column("document_id", BigInteger, ForeignKey("archive_documents.id", ondelete="CASCADE"),
           primary_key=True),
    Column("entity_id", BigInteger, ForeignKey("archive_entities.id", ondelete="CASCADE"),
           primary_key=True),
    Column("score", Float),
    Column("mentions", Integer, nullable=False, server_default=text("1")),
    Column("run_id", UUID(as_uuid=True)),
    Index("ix_document_entities_entity", "entity_id"),
)

archive_entity_stopwords = Table(
    "archive_entity_stopwords",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("term", Text, nullable=False, unique=True),
)

archive_entity_exclusions = Table(
    "archive_entity_exclusions",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("label", Text),
    Column("term", Text, nullable=False),
    UniqueConstraint("label", "term", name="uq_entity_exclusion"),
)

archive_typologies = Table(
    "archive_typologies",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("description", Text),
    Column("active", Boolean, nullable=False, server_default=text("true")),
)

archive_document_typologies = Table(
    "archive_document_typologies",
    metadata,
    Column("document_id", BigInteger, ForeignKey("archive_documents.id", ondelete="CASCADE"),
           primary_key=True),
    Column("typology_id", BigInteger, ForeignKey("archive_typologies.id", ondelete="CASCADE"),
           primary_key=True),
    Column("score", Float, nullable=False),
    Column("run_id", UUID(as_uuid=True)),
)

archive_cleaning_rules = Table(
    "archive_cleaning_rules",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("kind", cleaning_rule_kind, nullable=False),
    Column("field", Text, nullable=False, server_default="title"),
    Column("pattern", Text),
    Column("replacement", Text),
    Column("message", Text),
    Column("engine_name", Text),
    Column("engine_options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("prompt", Text),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    # One active model check at a time: it is the quality validator's engine.
    Index("uq_cleaning_rule_active_llm_check", "kind", unique=True,
          postgresql_where=text("kind = 'LLM_CHECK' AND active")),
)

archive_review_queue = Table(
    "archive_review_queue",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("document_id", BigInteger, ForeignKey("archive_documents.id", ondelete="CASCADE"),
           nullable=False),
    Column("reason", Text, nullable=False),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("source_run_id", UUID(as_uuid=True)),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("resolved_at", TS),
    Column("resolved_by", Text),
    Index("uq_review_open_per_document", "document_id", unique=True,
          postgresql_where=text("resolved_at IS NULL")),
)

# Migration 0008: one row per open batch of a worker (RunContext.commit), checked and deleted by a
# deferred constraint trigger at COMMIT (the batch fence, decision 0100). UNLOGGED: a row never outlives
# its transaction.
archive_batch_fences = Table(
    "archive_batch_fences",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("runner_id", UUID(as_uuid=True), nullable=False),
    prefixes=["UNLOGGED"],
)
