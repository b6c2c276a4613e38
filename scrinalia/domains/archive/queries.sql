-- The ledger protocol's statements (docs/protocol.md), each in one place under one name.
--
-- Loaded once by scrinalia.domains.archive.queries (QUERIES); the PostgreSQL adapter sends them through
-- the functions of ledger.py, registry.py, worker_settings.py and workers/sdk.py, and the in-memory
-- ledger (runner/memory_ledger.py) has one method per name, keyed by it (@statement("<name>")).
-- Each block: "-- name: <name>", "-- fence: <what makes it safe>", then one SQL statement. Every
-- timestamp is the database's now() (clock_timestamp() at a batch's COMMIT). {run_columns} is the
-- WorkerRun columns (config and options also read from archive_worker_run_configs: ledger.RUN_COLUMNS),
-- {error_max} the error column's length, {runner_columns} and {settings_columns} the registry's and the
-- settings' columns (filled in by the Python that owns those shapes).

-- name: enqueue
-- fence: uq_worker_run_active -> WorkerRunAlreadyActive carrying the active run
INSERT INTO archive_worker_runs
    (worker_name, status, trigger, requested_by, requested_by_user_id, request,
     attempt, retry_of, not_before, schedule_id)
VALUES
    (:worker_name, 'QUEUED', CAST(:trigger AS worker_run_trigger), :requested_by, :requested_by_user_id,
     CAST(:request AS jsonb), :attempt, :retry_of,
     now() + make_interval(secs => CAST(:delay_seconds AS double precision)),
     :schedule_id)
RETURNING {run_columns}

-- name: enqueue_retries
-- fence: ON CONFLICT on uq_worker_run_active DO NOTHING
-- The latest run of every scheduled worker, when it is a SCHEDULE run that ended FAILED or INTERRUPTED
-- (not on its configuration) under the attempt limit: a new QUEUED row, attempt + 1, retry_of the failed
-- run, the same request, not_before = now() + base x 2^(attempt-1) with +-jitter, capped. ON CONFLICT on
-- the slot's partial unique index makes it race-free: if anything took the worker's slot meanwhile, the
-- retry waits for the next tick instead of failing. The scheduler's statement (scrinalia/scheduler/retry.py
-- holds the policy), not the runner's: the ledger port does not send it.
INSERT INTO archive_worker_runs
    (worker_name, status, trigger, requested_by, request, attempt, retry_of, not_before, schedule_id)
SELECT last.worker_name, 'QUEUED', 'SCHEDULE', 'scheduler (retry)', last.request, last.attempt + 1,
       last.run_id,
       now() + make_interval(secs => LEAST(:cap_s,
           :base_s * power(2, last.attempt - 1) * (1 - :jitter + random() * 2 * :jitter))),
       last.schedule_id
  FROM (SELECT DISTINCT worker_name FROM archive_worker_schedules) AS s
  CROSS JOIN LATERAL (
        SELECT r.* FROM archive_worker_runs r
         WHERE r.worker_name = s.worker_name
         ORDER BY r.id DESC
         LIMIT 1) AS last
 WHERE last.trigger = 'SCHEDULE'
   AND last.status IN ('FAILED', 'INTERRUPTED')
   AND last.exit_reason IS DISTINCT FROM 'configuration'
   AND last.attempt < :attempt_limit
ON CONFLICT (worker_name) WHERE status IN ('QUEUED', 'RUNNING') DO NOTHING
RETURNING run_id, worker_name, attempt, retry_of

-- name: claim_next
-- fence: FOR UPDATE SKIP LOCKED
UPDATE archive_worker_runs
   SET status = 'RUNNING',
       runner_id = :runner_id,
       started_at = now(),
       heartbeat_at = now(),
       lease_expires_at = now() + make_interval(secs => :lease_seconds)
 WHERE id = (
        SELECT id FROM archive_worker_runs
         WHERE status = 'QUEUED'
           AND worker_name = ANY(:capabilities)
           AND (not_before IS NULL OR not_before <= now())
         ORDER BY queued_at, id
         LIMIT 1
           FOR UPDATE SKIP LOCKED)
   AND status = 'QUEUED'
RETURNING {run_columns}

-- name: create_running
-- fence: uq_worker_run_active
INSERT INTO archive_worker_runs
    (worker_name, status, trigger, requested_by, request, runner_id,
     started_at, heartbeat_at, lease_expires_at)
VALUES
    (:worker_name, 'RUNNING', 'CLI', :requested_by, CAST(:request AS jsonb), :runner_id,
     now(), now(), now() + make_interval(secs => :lease_seconds))
RETURNING {run_columns}

-- name: record_start
-- fence: runner_id = me AND status = 'RUNNING'
-- The configuration and options go to a row of their own, once, and only with the run row's update (the
-- fence): the run's row, which the heartbeat and the progress rewrite all the run's life, keeps the engine
-- and the preset (decision 0394). A statement retried after its COMMIT's answer was lost finds the
-- configuration recorded, and still answers for the run.
WITH started AS (
    UPDATE archive_worker_runs
       SET engine_name = :engine_name,
           preset = :preset
     WHERE run_id = :run_id AND runner_id = :runner_id AND status = 'RUNNING'
    RETURNING run_id
), recorded AS (
    INSERT INTO archive_worker_run_configs (run_id, config, options)
    SELECT run_id, CAST(:config AS jsonb), CAST(:options AS jsonb) FROM started
    ON CONFLICT (run_id) DO NOTHING
)
SELECT run_id FROM started

-- name: heartbeat
-- fence: runner_id = me
WITH registry AS (
    UPDATE archive_worker_runners
       SET last_heartbeat_at = now(),
           children = CASE WHEN CAST(:children AS jsonb) IS DISTINCT FROM children
                            AND CAST(:children AS jsonb) IS NOT NULL
                           THEN CAST(:children AS jsonb) ELSE children END
     WHERE runner_id = :runner_id
    RETURNING drain_requested_at
), reported AS (  -- the warm models, only when they changed (the supervisor sends none otherwise)
    UPDATE archive_worker_runner_reports
       SET warm = CAST(:warm AS jsonb)
     WHERE runner_id = :runner_id AND CAST(:warm AS jsonb) IS NOT NULL
), runs AS (
    UPDATE archive_worker_runs AS r
       SET heartbeat_at = now(),
           lease_expires_at = now() + make_interval(secs => :lease_seconds),
           progress = COALESCE(CAST(:progress AS jsonb) -> r.run_id::text, r.progress)
     WHERE r.runner_id = :runner_id AND r.status = 'RUNNING'
    RETURNING r.run_id, r.cancel_requested_at
)
SELECT (SELECT count(*) FROM registry) AS registry_renewed,
       (SELECT drain_requested_at FROM registry) AS drain_requested_at,
       now() AS db_now,
       now() + make_interval(secs => :lease_seconds) AS lease_expires_at,
       runs.run_id,
       runs.cancel_requested_at
  FROM (SELECT 1) AS one
  LEFT JOIN runs ON true

-- name: record_progress
-- fence: runner_id = me AND status = 'RUNNING'
-- One statement for all of a runner's children, whatever their number: the progress map arrives as one
-- jsonb object {run_id: progress} and is joined to the rows. A row whose progress did not change is not
-- rewritten, so it neither makes a dead tuple nor fires the ledger's notification.
UPDATE archive_worker_runs AS r
   SET progress = p.progress
  FROM jsonb_each(CAST(:progress AS jsonb)) AS p(run_id, progress)
 WHERE r.run_id = CAST(p.run_id AS uuid)
   AND r.runner_id = :runner_id
   AND r.status = 'RUNNING'
   AND r.progress IS DISTINCT FROM p.progress

-- name: finish
-- fence: runner_id = me AND status = 'RUNNING'
UPDATE archive_worker_runs
   SET status = CAST(:status AS worker_run_status),
       finished_at = now(),
       duration_ms = GREATEST(0, (extract(epoch FROM now() - started_at) * 1000))::bigint,
       error = left(:error, {error_max}),
       exit_code = :exit_code,
       exit_signal = :exit_signal,
       exit_reason = :exit_reason,
       progress = COALESCE(CAST(:progress AS jsonb), progress),
       metrics = COALESCE(CAST(:metrics AS jsonb), metrics),
       result = COALESCE(CAST(:result AS jsonb), result)
 WHERE run_id = :run_id AND runner_id = :runner_id AND status = 'RUNNING'
RETURNING {run_columns}

-- name: expire_leases
-- fence: the lease (lease_expires_at < now()), FOR UPDATE SKIP LOCKED
UPDATE archive_worker_runs
   SET status = 'INTERRUPTED',
       finished_at = now(),
       duration_ms = GREATEST(0, (extract(epoch FROM now() - started_at) * 1000))::bigint,
       exit_reason = 'lease-lost',
       error = 'LeaseExpired: the runner stopped renewing its lease (last heartbeat '
               || to_char(heartbeat_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')'
 WHERE id IN (
        SELECT id FROM archive_worker_runs
         WHERE status = 'RUNNING' AND lease_expires_at < now()
           FOR UPDATE SKIP LOCKED)
   AND status = 'RUNNING' AND lease_expires_at < now()
RETURNING {run_columns}

-- name: register_batch_fence
-- fence: the lease, at registration and again at COMMIT (migration 0008's deferred trigger, SF001)
-- The one statement a worker's batch adds to its own transaction (RunContext.commit). The INSERT
-- registers the fence: the deferred constraint trigger of migration 0008 checks, at COMMIT and with
-- clock_timestamp(), that the run is RUNNING, held by this runner and inside its lease (taking the row
-- FOR SHARE only then, a bounded wait), deletes the row and lets the COMMIT through, or raises SF001 and
-- the whole batch is rolled back. The WHERE EXISTS refuses a batch whose lease is already gone before it
-- writes anything (no row inserted: rowcount 0), without locking anything.
INSERT INTO archive_batch_fences (run_id, runner_id)
SELECT :run_id, :runner_id
 WHERE EXISTS (SELECT 1 FROM archive_worker_runs
                WHERE run_id = :run_id AND runner_id = :runner_id AND status = 'RUNNING'
                  AND lease_expires_at > clock_timestamp())

-- name: request_cancel
-- fence: status IN ('QUEUED', 'RUNNING'); the first request wins
UPDATE archive_worker_runs
   SET cancel_requested_at = COALESCE(cancel_requested_at, now()),
       cancel_requested_by = COALESCE(cancel_requested_by, :requested_by),
       status = CASE WHEN status = 'QUEUED' THEN 'CANCELLED'::worker_run_status ELSE status END,
       finished_at = CASE WHEN status = 'QUEUED' THEN now() ELSE finished_at END,
       duration_ms = CASE WHEN status = 'QUEUED' THEN 0 ELSE duration_ms END,
       exit_reason = CASE WHEN status = 'QUEUED' THEN 'cancelled' ELSE exit_reason END
 WHERE run_id = :run_id AND status IN ('QUEUED', 'RUNNING')
RETURNING {run_columns}

-- name: get_run
-- fence: a read (the run_id unique index)
SELECT {run_columns} FROM archive_worker_runs WHERE run_id = :run_id

-- name: active_run
-- fence: a read (the slot index uq_worker_run_active)
SELECT {run_columns} FROM archive_worker_runs WHERE worker_name = :worker_name AND status IN ('QUEUED', 'RUNNING')

-- name: worker_settings
-- fence: a read (the settings' primary key)
SELECT {settings_columns} FROM archive_worker_settings WHERE worker_name = :w

-- name: llm_check_rule
-- fence: a read (at most one active rule, by a partial unique index)
SELECT id, name, engine_name, engine_options, prompt, field, updated_at
  FROM archive_cleaning_rules WHERE kind = 'LLM_CHECK' AND active

-- name: register
-- fence: the registry's primary key and ck_runner_lease_exceeds_heartbeat
-- The devices and the model directories the runner sees go to a row of their own (decision 0395): the
-- registry's row, which the heartbeat rewrites at every beat, keeps what changes with the beat.
WITH registered AS (
    INSERT INTO archive_worker_runners
        (runner_id, name, kind, hostname, pid, package_version, schema_revision, capabilities,
         concurrency, heartbeat_seconds, lease_seconds, poll_seconds, children, started_at, last_heartbeat_at)
    VALUES
        (:runner_id, :name, :kind, :hostname, :pid, :package_version, :schema_revision, :capabilities,
         :concurrency, :heartbeat_seconds, :lease_seconds, :poll_seconds, '[]', now(), now())
    RETURNING runner_id
)
INSERT INTO archive_worker_runner_reports (runner_id, devices, sees)
SELECT runner_id, CAST(:devices AS jsonb), CAST(:sees AS jsonb) FROM registered

-- name: stop
-- fence: stopped_at IS NULL
UPDATE archive_worker_runners SET stopped_at = now(), children = '[]'
 WHERE runner_id = :runner_id AND stopped_at IS NULL

-- name: request_drain
-- fence: stopped_at IS NULL; the first request wins
UPDATE archive_worker_runners
   SET drain_requested_at = COALESCE(drain_requested_at, now()),
       drain_requested_by = COALESCE(drain_requested_by, :requested_by)
 WHERE runner_id = :runner_id AND stopped_at IS NULL
RETURNING runner_id
