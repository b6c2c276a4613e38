"""The finished-run totals are folded in at the scrape, not written by every finish; the oldest xmin holder.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05

Decision 0370 (replacing 0166's trigger): a run's end no longer upserts its worker's totals row (~270 B of
WAL per finish, and under a pinned xmin horizon a dead version of one hot row per finish). The totals are
``archive_run_totals`` (what was folded) plus the runs that ended since the watermark
(``archive_run_totals_watermark.folded_before``), read through the chart index
``ix_worker_runs_worker_finished`` (worker_name, finished_at): ``archive_run_totals_now()``. The scrape
first calls ``archive_run_totals_fold()``, which moves the runs that ended before a safe horizon into the
totals and advances the watermark, a bounded number per call, so what a scrape reads stays the runs of
the last minutes whatever the history.

Every end sets ``finished_at = now()``, its transaction's start. A run whose end commits after a fold must
not be older than that fold's watermark: the horizon is the oldest start among this database's
transactions that hold a transaction id (a writer, read from ``pg_stat_activity`` before the fold's
snapshot is taken) and the prepared ones, and at most now() minus ``MARGIN`` (an ending statement that
has not written yet has no id: it is bounded by the runner's statement and lock timeouts, far below it).

At the upgrade the trigger is dropped under its lock on the ledger (no run ends meanwhile); the runs of
the ledger that ended after the first horizon are taken back out of the totals, since the delta counts
them from now on. Additive for the previous release: it reads ``archive_run_totals`` as before (its
counters then lag by the fold's margin, and grow when this release's API scrapes), it never called the
trigger's function (kept, unused, for the contract step).

``archive_oldest_xmin()`` (decision 0371): the oldest holder of the xmin horizon among sessions, prepared
transactions and replication slots, for ``/metrics``, ``status`` and the panel. SECURITY DEFINER: what
``pg_stat_activity`` shows of other roles' sessions is the definer's (grant it ``pg_read_all_stats`` to see
every session's; without it only its own roles' sessions count).
"""
from alembic import op
from sqlalchemy import text

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

#: Seconds a fold stays behind now() (the bound of an ending statement that has not written yet).
MARGIN_S = 600
#: The most runs of one worker one fold moves into the totals.
FOLD_MAX_RUNS = 10000

_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_error_fingerprint'"
)


def upgrade() -> None:
    s = op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted
    op.execute(
        f"""
        CREATE TABLE archive_run_totals_watermark (
            one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
            folded_before TIMESTAMPTZ NOT NULL,
            folded_at TIMESTAMPTZ NOT NULL
        );

        -- The runs that ended in [since, before), per worker and final status, in a totals row's shape. The
        -- workers by a skip scan of the chart index, then each worker's range of it: the runs read are
        -- the range's, never the history.
        CREATE FUNCTION {s}.archive_run_totals_ended(since timestamptz, before timestamptz)
            RETURNS TABLE (worker_name varchar, status worker_run_status, runs bigint, timed bigint,
                           duration_seconds_sum double precision, duration_buckets bigint[])
            LANGUAGE sql STABLE
            ROWS 64
            SET jit = off
            SET search_path = pg_catalog, {s}, pg_temp
            AS $$
        WITH RECURSIVE workers(name) AS (
            (SELECT r.worker_name FROM archive_worker_runs r WHERE r.finished_at IS NOT NULL
              ORDER BY r.worker_name LIMIT 1)
            UNION ALL
            SELECT (SELECT r.worker_name FROM archive_worker_runs r
                     WHERE r.finished_at IS NOT NULL AND r.worker_name > w.name
                     ORDER BY r.worker_name LIMIT 1)
              FROM workers w WHERE w.name IS NOT NULL
        ), ended AS (
            SELECT e.worker_name, e.status,
                   CASE WHEN e.started_at IS NOT NULL THEN e.duration_ms / 1000.0 END AS seconds
              FROM workers w
              JOIN LATERAL (SELECT r.worker_name, r.status, r.started_at, r.duration_ms
                              FROM archive_worker_runs r
                             WHERE r.worker_name = w.name AND r.finished_at IS NOT NULL
                               AND r.finished_at >= since AND r.finished_at < before) e ON true
             WHERE w.name IS NOT NULL AND e.status NOT IN ('QUEUED', 'RUNNING')
        ), buckets AS (
            SELECT e.worker_name, e.status, u.i, count(*) FILTER (WHERE e.seconds <= u.b) AS n
              FROM ended e CROSS JOIN unnest(archive_run_duration_bounds()) WITH ORDINALITY AS u(b, i)
             GROUP BY e.worker_name, e.status, u.i
        )
        SELECT e.worker_name, e.status, count(*), count(e.seconds), COALESCE(sum(e.seconds), 0),
               (SELECT array_agg(b.n ORDER BY b.i) FROM buckets b
                 WHERE b.worker_name = e.worker_name AND b.status = e.status)
          FROM ended e
         GROUP BY e.worker_name, e.status
        $$;

        -- What /metrics reports: the folded totals plus the runs ended since the watermark, in one
        -- snapshot (the fold commits the totals and the watermark together).
        CREATE FUNCTION {s}.archive_run_totals_now()
            RETURNS TABLE (worker_name varchar, status worker_run_status, runs bigint, timed bigint,
                           duration_seconds_sum double precision, duration_buckets bigint[])
            LANGUAGE sql STABLE
            ROWS 64
            SET jit = off
            SET search_path = pg_catalog, {s}, pg_temp
            AS $$
        WITH parts AS (
            SELECT t.worker_name, t.status, t.runs, t.timed, t.duration_seconds_sum, t.duration_buckets
              FROM archive_run_totals t
            UNION ALL
            SELECT d.* FROM archive_run_totals_watermark m,
                   archive_run_totals_ended(m.folded_before, 'infinity') d
        ), cells AS (
            SELECT p.worker_name, p.status, u.i, sum(u.n)::bigint AS n
              FROM parts p CROSS JOIN unnest(p.duration_buckets) WITH ORDINALITY AS u(n, i)
             GROUP BY p.worker_name, p.status, u.i
        )
        SELECT p.worker_name, p.status, sum(p.runs)::bigint, sum(p.timed)::bigint, sum(p.duration_seconds_sum),
               (SELECT array_agg(c.n ORDER BY c.i) FROM cells c
                 WHERE c.worker_name = p.worker_name AND c.status = p.status)
          FROM parts p
         GROUP BY p.worker_name, p.status
        $$;

        -- Before which finish time no run can still end uncommitted (read before the fold's snapshot).
        CREATE FUNCTION {s}.archive_run_totals_horizon(margin_s double precision DEFAULT {MARGIN_S})
            RETURNS timestamptz
            LANGUAGE sql STABLE
            SET search_path = pg_catalog, {s}, pg_temp
            AS $$
        SELECT LEAST(now() - make_interval(secs => GREATEST(margin_s, 0)),
                     (SELECT min(a.xact_start) FROM pg_stat_activity a
                       WHERE a.backend_xid IS NOT NULL AND a.datname = current_database()),
                     (SELECT min(x.prepared) - make_interval(secs => GREATEST(margin_s, 0)) FROM pg_prepared_xacts x
                       WHERE x.database = current_database()))
        $$;

        -- Moves the runs ended before the horizon into the totals (at most max_runs per worker) and
        -- advances the watermark; NULL when another fold holds the lock or the caller's snapshot is not a
        -- statement's own (the horizon must be read before the snapshot that folds).
        CREATE FUNCTION {s}.archive_run_totals_fold(max_runs integer DEFAULT {FOLD_MAX_RUNS},
                                                    margin_s double precision DEFAULT {MARGIN_S})
            RETURNS timestamptz
            LANGUAGE plpgsql SECURITY DEFINER
            SET jit = off
            SET search_path = pg_catalog, {s}, pg_temp
            AS $$
        DECLARE
            horizon timestamptz;
            since timestamptz;
            upto timestamptz;
        BEGIN
            IF current_setting('transaction_isolation') <> 'read committed'
               OR NOT pg_try_advisory_xact_lock(hashtext('archive_run_totals_fold')) THEN
                RETURN NULL;
            END IF;
            horizon := archive_run_totals_horizon(margin_s);
            SELECT m.folded_before INTO since FROM archive_run_totals_watermark m FOR UPDATE;
            IF since IS NULL OR horizon <= since THEN
                RETURN since;
            END IF;
            -- Bounded: up to the earliest (max_runs + 1)-th end of any worker after the watermark.
            WITH RECURSIVE workers(name) AS (
                (SELECT r.worker_name FROM archive_worker_runs r WHERE r.finished_at IS NOT NULL
                  ORDER BY r.worker_name LIMIT 1)
                UNION ALL
                SELECT (SELECT r.worker_name FROM archive_worker_runs r
                         WHERE r.finished_at IS NOT NULL AND r.worker_name > w.name
                         ORDER BY r.worker_name LIMIT 1)
                  FROM workers w WHERE w.name IS NOT NULL
            )
            SELECT min(n.finished_at) INTO upto
              FROM workers w
              JOIN LATERAL (SELECT r.finished_at FROM archive_worker_runs r
                             WHERE r.worker_name = w.name AND r.finished_at IS NOT NULL
                               AND r.finished_at >= since AND r.finished_at < horizon
                             ORDER BY r.finished_at OFFSET max_runs LIMIT 1) n ON true
             WHERE w.name IS NOT NULL;
            upto := LEAST(horizon, COALESCE(upto, horizon));
            IF upto <= since THEN  -- more than max_runs ends of one worker at one instant
                upto := since + interval '1 microsecond';
            END IF;
            INSERT INTO archive_run_totals AS t
                   (worker_name, status, runs, timed, duration_seconds_sum, duration_buckets)
            SELECT d.worker_name, d.status, d.runs, d.timed, d.duration_seconds_sum, d.duration_buckets
              FROM archive_run_totals_ended(since, upto) d
            ON CONFLICT (worker_name, status) DO UPDATE
               SET runs = t.runs + EXCLUDED.runs,
                   timed = t.timed + EXCLUDED.timed,
                   duration_seconds_sum = t.duration_seconds_sum + EXCLUDED.duration_seconds_sum,
                   duration_buckets = (SELECT array_agg(u.a + u.b ORDER BY u.i)
                                         FROM unnest(t.duration_buckets, EXCLUDED.duration_buckets)
                                              WITH ORDINALITY AS u(a, b, i));
            UPDATE archive_run_totals_watermark SET folded_before = upto, folded_at = now();
            RETURN upto;
        END
        $$;

        -- The oldest holder of the xmin horizon: a session (its transaction's start), a prepared
        -- transaction (when it was prepared) or a replication slot (no time: its age in transactions).
        CREATE FUNCTION {s}.archive_oldest_xmin()
            RETURNS TABLE (kind text, age_seconds double precision, age_xids bigint, pid integer,
                           application_name text, state text, holder text)
            LANGUAGE sql STABLE SECURITY DEFINER
            SET search_path = pg_catalog, {s}, pg_temp
            AS $$
        SELECT h.kind, h.age_seconds, h.age_xids, h.pid, h.application_name, h.state, h.holder FROM (
            SELECT 'session'::text AS kind,
                   GREATEST(0, extract(epoch FROM now() - COALESCE(a.xact_start, a.query_start, a.backend_start)))
                       ::double precision AS age_seconds,
                   age(a.backend_xmin)::bigint AS age_xids, a.pid, a.application_name, a.state,
                   COALESCE(a.datname, '') AS holder
              FROM pg_stat_activity a
             WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
            UNION ALL
            SELECT 'prepared', GREATEST(0, extract(epoch FROM now() - x.prepared))::double precision,
                   age(x.transaction)::bigint, NULL, NULL, NULL, x.gid
              FROM pg_prepared_xacts x
            UNION ALL
            SELECT 'slot', NULL, GREATEST(age(s.xmin), age(s.catalog_xmin))::bigint, s.active_pid, NULL,
                   CASE WHEN s.active THEN 'active' ELSE 'inactive' END, s.slot_name::text
              FROM pg_replication_slots s
             WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
        ) h
        ORDER BY h.age_xids DESC NULLS LAST, h.age_seconds DESC NULLS LAST
        LIMIT 1
        $$;

        -- The end of the trigger: its lock on the ledger (SHARE ROW EXCLUSIVE) holds every end until this
        -- transaction commits, so the totals count exactly the ends committed before.
        DROP TRIGGER trg_archive_run_totals ON archive_worker_runs;
        INSERT INTO archive_run_totals_watermark (folded_before, folded_at)
        VALUES (archive_run_totals_horizon(), now());
        -- The ends since the watermark are the delta's from now on: out of the totals.
        UPDATE archive_run_totals AS t
           SET runs = t.runs - d.runs,
               timed = t.timed - d.timed,
               duration_seconds_sum = t.duration_seconds_sum - d.duration_seconds_sum,
               duration_buckets = (SELECT array_agg(u.a - u.b ORDER BY u.i)
                                     FROM unnest(t.duration_buckets, d.duration_buckets) WITH ORDINALITY AS u(a, b, i))
          FROM archive_run_totals_watermark m, archive_run_totals_ended(m.folded_before, 'infinity') d
         WHERE t.worker_name = d.worker_name AND t.status = d.status;

        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE TRIGGER trg_archive_run_totals
            AFTER UPDATE OF status ON archive_worker_runs
            FOR EACH ROW
            WHEN (OLD.status IN ('QUEUED', 'RUNNING') AND NEW.status NOT IN ('QUEUED', 'RUNNING'))
            EXECUTE FUNCTION archive_run_totals_add();
        UPDATE archive_run_totals AS t
           SET runs = t.runs + d.runs,
               timed = t.timed + d.timed,
               duration_seconds_sum = t.duration_seconds_sum + d.duration_seconds_sum,
               duration_buckets = (SELECT array_agg(u.a + u.b ORDER BY u.i)
                                     FROM unnest(t.duration_buckets, d.duration_buckets) WITH ORDINALITY AS u(a, b, i))
          FROM archive_run_totals_watermark m, archive_run_totals_ended(m.folded_before, 'infinity') d
         WHERE t.worker_name = d.worker_name AND t.status = d.status;
        INSERT INTO archive_run_totals (worker_name, status, runs, timed, duration_seconds_sum, duration_buckets)
        SELECT d.* FROM archive_run_totals_watermark m, archive_run_totals_ended(m.folded_before, 'infinity') d
        ON CONFLICT (worker_name, status) DO NOTHING;
        DROP FUNCTION archive_oldest_xmin();
        DROP FUNCTION archive_run_totals_fold(integer, double precision);
        DROP FUNCTION archive_run_totals_horizon(double precision);
        DROP FUNCTION archive_run_totals_now();
        DROP FUNCTION archive_run_totals_ended(timestamptz, timestamptz);
        DROP TABLE archive_run_totals_watermark;
        """
    )
