"""The batch fence is checked at COMMIT: a batch whose transaction commits after its run's lease is refused.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Until now a worker's batch began with ``SELECT ... FOR UPDATE`` on its run's row and held that lock for
the whole batch: a child frozen (or cut off) mid-batch held the row, and every ``expire_leases``, every
heartbeat of its runner and every scheduler tick waited on it; and the lease was checked when the batch
*began*, so a batch left open could still commit long after the lease had passed (decision 0100).

Now the batch registers its fence with one short statement, an INSERT into the UNLOGGED table
``archive_batch_fences``. A DEFERRABLE INITIALLY DEFERRED constraint trigger on that table runs at COMMIT,
after every write of the batch: it takes the run's row FOR SHARE (a bounded wait: only one-statement
protocol steps ever hold a conflicting lock on it, for milliseconds), checks with ``clock_timestamp()`` that
the run is still RUNNING, held by that runner and inside its lease, deletes the fence row and lets the
COMMIT proceed; otherwise it raises SQLSTATE ``SF001`` and the whole batch is rolled back. The share lock
is held only between that check and the end of the COMMIT (the server does both with no client round trip
between them), so an expiry cannot slip in between the check and the commit, and nothing waits on it.

UNLOGGED: a fence row never outlives its transaction (the trigger deletes it), so it needs no WAL.
"""
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

#: The SQLSTATE of a refused batch (class "SF": scrinalia fence; not a class PostgreSQL uses).
FENCE_SQLSTATE = "SF001"

UPGRADE = f"""
CREATE UNLOGGED TABLE archive_batch_fences (
    run_id uuid NOT NULL,
    runner_id uuid NOT NULL
);

CREATE FUNCTION archive_check_batch_fence() RETURNS trigger
LANGUAGE plpgsql
SET lock_timeout = '2s'
AS $fn$
DECLARE
    held_status text;
    held_runner uuid;
    held_until timestamptz;
BEGIN
    SELECT r.status::text, r.runner_id, r.lease_expires_at
      INTO held_status, held_runner, held_until
      FROM public.archive_worker_runs AS r
     WHERE r.run_id = NEW.run_id
       FOR SHARE OF r;
    IF NOT FOUND OR held_status IS DISTINCT FROM 'RUNNING' OR held_runner IS DISTINCT FROM NEW.runner_id
       OR held_until IS NULL OR held_until <= pg_catalog.clock_timestamp() THEN
        RAISE EXCEPTION USING
            ERRCODE = '{FENCE_SQLSTATE}',
            MESSAGE = pg_catalog.format(
                'LeaseLost: run %s is not held by runner %s at commit (status %s, lease until %s, now %s)',
                NEW.run_id, NEW.runner_id, coalesce(held_status, 'unknown'),
                coalesce(held_until::text, 'none'), pg_catalog.clock_timestamp());
    END IF;
    DELETE FROM public.archive_batch_fences AS f WHERE f.run_id = NEW.run_id AND f.runner_id = NEW.runner_id;
    RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER trg_batch_fence_at_commit
    AFTER INSERT ON archive_batch_fences
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION archive_check_batch_fence();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER IF EXISTS trg_batch_fence_at_commit ON archive_batch_fences;
        DROP FUNCTION IF EXISTS archive_check_batch_fence();
        DROP TABLE IF EXISTS archive_batch_fences;
        """
    )
