"""Crash-loop quarantine on the schedules, and the finished-run totals that /metrics reads.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

Quarantine (decision 0165): the scheduler pauses a schedule whose last N retry chains ended FAILED with
one fingerprint. It sets ``enabled = false`` as a disable does (so a scheduler of the previous release,
which knows only ``enabled``, leaves the schedule alone too) and says why in the new columns; resuming
clears them and records when, so the chains that led to the quarantine are not counted again.

Finished-run totals (decision 0166): ``archive_run_totals`` holds, per worker and final status, how many
runs ended and the histogram of their durations, kept by a row trigger on the one transition that ends a
run (QUEUED or RUNNING -> a final status). A Prometheus counter must only grow and a scrape must not
scan the history, so the totals are kept rather than counted; one worker has at most one active run,
so no two statements ever update the same total at once. The trigger function is SECURITY DEFINER with
a pinned ``search_path``: the runner's role ends runs and so fires it, without any privilege on the
totals. The bounds of the histogram are ``archive_run_duration_bounds()``, read by the collector.

Only additions: the previous release reads and writes the tables as before.
"""
from alembic import op
from sqlalchemy import text

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: Upper bounds of the duration histogram, in seconds (the last bucket, +Inf, is the count).
BOUNDS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)


_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_error_fingerprint'"
)


def upgrade() -> None:
    s = op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted
    bounds = ", ".join(f"{b}" for b in BOUNDS)
    op.execute(
        f"""
        ALTER TABLE archive_worker_schedules
            ADD COLUMN quarantined_at TIMESTAMPTZ,
            ADD COLUMN quarantine_reason TEXT,
            ADD COLUMN quarantine_fingerprint TEXT,
            ADD COLUMN quarantine_run_id UUID,
            ADD COLUMN quarantine_resumed_at TIMESTAMPTZ,
            ADD COLUMN quarantine_resumed_by TEXT;

        -- The quarantine check reads a schedule's latest runs: the scheduled rows only (a manual run
        -- pays no entry in it).
        CREATE INDEX ix_worker_runs_schedule_id ON archive_worker_runs (schedule_id, id DESC)
            WHERE schedule_id IS NOT NULL AND trigger = 'SCHEDULE';

        CREATE FUNCTION {s}.archive_run_duration_bounds() RETURNS double precision[]
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $$ SELECT ARRAY[{bounds}]::double precision[] $$;

        CREATE TABLE archive_run_totals (
            worker_name VARCHAR(100) NOT NULL,
            status worker_run_status NOT NULL,
            runs BIGINT NOT NULL DEFAULT 0,
            timed BIGINT NOT NULL DEFAULT 0,
            duration_seconds_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
            duration_buckets BIGINT[] NOT NULL,
            PRIMARY KEY (worker_name, status)
        );

        CREATE FUNCTION {s}.archive_run_totals_add() RETURNS trigger
            LANGUAGE plpgsql SECURITY DEFINER
            SET search_path = pg_catalog, {s}, pg_temp
            AS $$
        DECLARE
            -- A run cancelled while QUEUED never started: counted, not timed (its duration_ms is 0).
            seconds double precision := CASE WHEN NEW.started_at IS NOT NULL THEN NEW.duration_ms / 1000.0 END;
            hits bigint[];
        BEGIN
            SELECT array_agg(CASE WHEN seconds IS NOT NULL AND seconds <= u.b THEN 1 ELSE 0 END ORDER BY u.i)
              INTO hits
              FROM unnest({s}.archive_run_duration_bounds()) WITH ORDINALITY AS u(b, i);
            INSERT INTO {s}.archive_run_totals AS t
                   (worker_name, status, runs, timed, duration_seconds_sum, duration_buckets)
            VALUES (NEW.worker_name, NEW.status, 1, CASE WHEN seconds IS NULL THEN 0 ELSE 1 END,
                    COALESCE(seconds, 0), hits)
            ON CONFLICT (worker_name, status) DO UPDATE
               SET runs = t.runs + 1,
                   timed = t.timed + EXCLUDED.timed,
                   duration_seconds_sum = t.duration_seconds_sum + EXCLUDED.duration_seconds_sum,
                   duration_buckets = (SELECT array_agg(u.a + u.b ORDER BY u.i)
                                         FROM unnest(t.duration_buckets, EXCLUDED.duration_buckets)
                                              WITH ORDINALITY AS u(a, b, i));
            RETURN NULL;
        END
        $$;

        CREATE TRIGGER trg_archive_run_totals
            AFTER UPDATE OF status ON archive_worker_runs
            FOR EACH ROW
            WHEN (OLD.status IN ('QUEUED', 'RUNNING') AND NEW.status NOT IN ('QUEUED', 'RUNNING'))
            EXECUTE FUNCTION {s}.archive_run_totals_add();

        -- The history so far, in one pass (CREATE TRIGGER holds its lock on the ledger until this
        -- transaction commits: no run ends between the backfill and the trigger).
        WITH ended AS (
            SELECT worker_name, status,
                   CASE WHEN started_at IS NOT NULL THEN duration_ms / 1000.0 END AS seconds
              FROM archive_worker_runs
             WHERE status NOT IN ('QUEUED', 'RUNNING')
        ), buckets AS (
            SELECT e.worker_name, e.status, u.i, count(*) FILTER (WHERE e.seconds <= u.b) AS n
              FROM ended e CROSS JOIN unnest({s}.archive_run_duration_bounds()) WITH ORDINALITY AS u(b, i)
             GROUP BY e.worker_name, e.status, u.i
        )
        INSERT INTO archive_run_totals (worker_name, status, runs, timed, duration_seconds_sum, duration_buckets)
        SELECT e.worker_name, e.status, count(*), count(e.seconds), COALESCE(sum(e.seconds), 0),
               (SELECT array_agg(b.n ORDER BY b.i) FROM buckets b
                 WHERE b.worker_name = e.worker_name AND b.status = e.status)
          FROM ended e
         GROUP BY e.worker_name, e.status;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER trg_archive_run_totals ON archive_worker_runs;
        DROP FUNCTION archive_run_totals_add();
        DROP TABLE archive_run_totals;
        DROP FUNCTION archive_run_duration_bounds();
        DROP INDEX ix_worker_runs_schedule_id;
        ALTER TABLE archive_worker_schedules
            DROP COLUMN quarantined_at, DROP COLUMN quarantine_reason, DROP COLUMN quarantine_fingerprint,
            DROP COLUMN quarantine_run_id, DROP COLUMN quarantine_resumed_at, DROP COLUMN quarantine_resumed_by;
        """
    )
