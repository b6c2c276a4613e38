"""The panel's charts: a run's samples over its life, and the two indexes the trend charts read.

Revision ID: 0015
Revises: 0011
Create Date: 2026-12-02

``archive_worker_run_samples`` keeps what a run's chart needs (units done, the total, the child's RSS and
GPU memory) over the run's life; the ledger row keeps only the latest progress. Two triggers fill it, so
no protocol statement changes (decision 0160):

* ``archive_sample_run_progress`` on the run row's progress update (``record_progress``, the heartbeat)
  and on its end (``finish``, ``expire_leases``): one sample of done/total, at most one per
  ``SAMPLE_SPACING_SECONDS`` or per age/``SPACING_PER_AGE`` while the run is RUNNING (the progress
  statement comes every 0.5 s: a chart needs far less), and always the last progress when it ends;
* ``archive_sample_runner_children`` on the registry row's children snapshot (the heartbeat): one sample
  per child with its RSS and GPU memory, at the heartbeat's cadence (the supervisor samples memory then),
  at most one per age/``SPACING_PER_AGE`` (from the snapshot's ``elapsed_seconds``).

Both are SECURITY DEFINER with a pinned ``search_path`` (like 0010's counters): the runner's role fires
them and needs no privilege on the samples. Every value is read defensively (a non-number is NULL, a
malformed run id is skipped): a trigger that raised would fail the heartbeat, and with it the lease.

Old samples go: ``scrinalia.domains.archive.charts.prune_samples`` (the scheduler's tick, bounded batch)
deletes the samples of runs queued before the retention, by the time-ordered run id (migration 0003) on
the samples' own index: no index on the sample time is needed.

The trend charts read two partial indexes of finished runs: runs per hour and durations per worker
(``ix_worker_runs_worker_finished``), slots busy per runner (``ix_worker_runs_runner_finished``). Neither
holds a QUEUED or RUNNING row, so an enqueue and a claim add no entry; a finish (already a non-HOT update:
its status is indexed) adds one to each.
"""
from alembic import op
from sqlalchemy import text

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

#: At most one progress sample per run in this many seconds while it runs...
SAMPLE_SPACING_SECONDS = 2
#: ... and in its age / SPACING_PER_AGE: the spacing grows with the run, so a run of a day keeps ~1,800
#: progress samples, not 43,200, and every part of its life still has at least the resolution the chart
#: shows (it folds a run into 300 buckets of its whole life). The heartbeat's memory samples likewise.
SPACING_PER_AGE = 300

_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_uuid_v7'"
)

TABLE = """
CREATE TABLE archive_worker_run_samples (
    run_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    done bigint,
    total bigint,
    rss_bytes bigint,
    gpu_bytes bigint
);
CREATE INDEX ix_run_samples_run_at ON archive_worker_run_samples (run_id, at);
CREATE INDEX ix_worker_runs_worker_finished ON archive_worker_runs (worker_name, finished_at)
    INCLUDE (status, duration_ms) WHERE finished_at IS NOT NULL;
CREATE INDEX ix_worker_runs_runner_finished ON archive_worker_runs (runner_id, finished_at)
    INCLUDE (started_at) WHERE finished_at IS NOT NULL AND runner_id IS NOT NULL;
"""


def _functions(s: str) -> str:
    return f"""
CREATE FUNCTION {s}.archive_jsonb_bigint(v jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $f$
    SELECT CASE WHEN jsonb_typeof(v) = 'number' AND abs(v::numeric) < 9e18 THEN trunc(v::numeric)::bigint END
$f$;

CREATE FUNCTION {s}.archive_sample_run_progress() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {s}, pg_temp
AS $f$
BEGIN
    IF NEW.status = 'RUNNING' AND EXISTS (
        SELECT 1 FROM {s}.archive_worker_run_samples AS s
         WHERE s.run_id = NEW.run_id
           AND s.at > now() - GREATEST(interval '{SAMPLE_SPACING_SECONDS} seconds',
                                       (now() - COALESCE(NEW.started_at, now())) / {SPACING_PER_AGE})) THEN
        RETURN NULL;
    END IF;
    INSERT INTO {s}.archive_worker_run_samples (run_id, done, total)
    VALUES (NEW.run_id, {s}.archive_jsonb_bigint(NEW.progress -> 'done'),
            {s}.archive_jsonb_bigint(NEW.progress -> 'total'));
    RETURN NULL;
END
$f$;

CREATE FUNCTION {s}.archive_sample_runner_children() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {s}, pg_temp
AS $f$
BEGIN
    IF jsonb_typeof(NEW.children) IS DISTINCT FROM 'array' THEN
        RETURN NULL;
    END IF;
    INSERT INTO {s}.archive_worker_run_samples (run_id, done, total, rss_bytes, gpu_bytes)
    SELECT (c ->> 'run_id')::uuid,
           {s}.archive_jsonb_bigint(c -> 'progress' -> 'done'),
           {s}.archive_jsonb_bigint(c -> 'progress' -> 'total'),
           {s}.archive_jsonb_bigint(c -> 'rss_bytes'),
           {s}.archive_jsonb_bigint(c -> 'gpu_memory_bytes')
      FROM jsonb_array_elements(NEW.children) AS c
     WHERE jsonb_typeof(c) = 'object'
       AND jsonb_typeof(c -> 'rss_bytes') = 'number'
       AND (c ->> 'run_id') ~ '^[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{12}}$'
       AND NOT EXISTS (
           SELECT 1 FROM {s}.archive_worker_run_samples AS s
            WHERE s.run_id = (c ->> 'run_id')::uuid AND s.rss_bytes IS NOT NULL
              AND s.at > now() - make_interval(
                  secs => COALESCE({s}.archive_jsonb_bigint(c -> 'elapsed_seconds'), 0) / {SPACING_PER_AGE}.0));
    RETURN NULL;
END
$f$;
"""


TRIGGERS = """
CREATE TRIGGER trg_worker_runs_sample_progress AFTER UPDATE OF progress, status ON archive_worker_runs
    FOR EACH ROW
    WHEN (NEW.progress IS NOT NULL AND (
          (NEW.status = 'RUNNING' AND NEW.progress IS DISTINCT FROM OLD.progress)
          OR (OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING')))
    EXECUTE FUNCTION archive_sample_run_progress();
CREATE TRIGGER trg_worker_runners_sample_children AFTER UPDATE OF children ON archive_worker_runners
    FOR EACH ROW
    WHEN (NEW.children IS DISTINCT FROM OLD.children)
    EXECUTE FUNCTION archive_sample_runner_children();
"""


def upgrade() -> None:
    schema = op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted
    op.execute(TABLE)
    op.execute(_functions(schema))
    op.execute(TRIGGERS)


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER IF EXISTS trg_worker_runners_sample_children ON archive_worker_runners;
        DROP TRIGGER IF EXISTS trg_worker_runs_sample_progress ON archive_worker_runs;
        DROP FUNCTION IF EXISTS archive_sample_runner_children();
        DROP FUNCTION IF EXISTS archive_sample_run_progress();
        DROP FUNCTION IF EXISTS archive_jsonb_bigint(jsonb);
        DROP INDEX IF EXISTS ix_worker_runs_runner_finished;
        DROP INDEX IF EXISTS ix_worker_runs_worker_finished;
        DROP TABLE IF EXISTS archive_worker_run_samples;
        """
    )
