"""The ledger announces its changes: NOTIFY on the channel ``scrinalia_ledger`` from triggers.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A trigger, not a ``pg_notify`` in each protocol statement, so every statement of the protocol stays one
statement and no writer can forget to announce. The notification is sent at COMMIT (PostgreSQL queues it
with the transaction), so a listener never hears of a change it cannot read yet.

Only what an operator can see fires it: a new run; a run's status, progress or cancel request; a
runner's registration, its children snapshot, its stop or a drain request. A heartbeat that only renews
leases (``heartbeat_at``, ``lease_expires_at``, ``last_heartbeat_at``) is filtered out by the trigger's
WHEN clause, so it costs nothing and idle runners make no noise.

The payload is small JSON (well under the 8000-byte limit of NOTIFY):
    {"kind": "run", "run_id": "...", "worker": "...", "status": "RUNNING", "cancel": false}
    {"kind": "runner", "runner_id": "..."}
"""
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

CHANNEL = "scrinalia_ledger"

FUNCTIONS = f"""
CREATE FUNCTION archive_notify_run() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{CHANNEL}', json_build_object(
        'kind', 'run', 'run_id', NEW.run_id, 'worker', NEW.worker_name, 'status', NEW.status,
        'cancel', NEW.cancel_requested_at IS NOT NULL)::text);
    RETURN NULL;
END
$fn$;

CREATE FUNCTION archive_notify_runner() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{CHANNEL}', json_build_object('kind', 'runner', 'runner_id', NEW.runner_id)::text);
    RETURN NULL;
END
$fn$;
"""

TRIGGERS = """
CREATE TRIGGER trg_worker_runs_notify_insert AFTER INSERT ON archive_worker_runs
    FOR EACH ROW EXECUTE FUNCTION archive_notify_run();
CREATE TRIGGER trg_worker_runs_notify_update AFTER UPDATE ON archive_worker_runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.progress IS DISTINCT FROM NEW.progress
          OR OLD.cancel_requested_at IS DISTINCT FROM NEW.cancel_requested_at)
    EXECUTE FUNCTION archive_notify_run();
CREATE TRIGGER trg_worker_runners_notify_insert AFTER INSERT ON archive_worker_runners
    FOR EACH ROW EXECUTE FUNCTION archive_notify_runner();
CREATE TRIGGER trg_worker_runners_notify_update AFTER UPDATE ON archive_worker_runners
    FOR EACH ROW
    WHEN (OLD.children IS DISTINCT FROM NEW.children
          OR OLD.stopped_at IS DISTINCT FROM NEW.stopped_at
          OR OLD.drain_requested_at IS DISTINCT FROM NEW.drain_requested_at)
    EXECUTE FUNCTION archive_notify_runner();
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)
    op.execute(TRIGGERS)


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER IF EXISTS trg_worker_runners_notify_update ON archive_worker_runners;
        DROP TRIGGER IF EXISTS trg_worker_runners_notify_insert ON archive_worker_runners;
        DROP TRIGGER IF EXISTS trg_worker_runs_notify_update ON archive_worker_runs;
        DROP TRIGGER IF EXISTS trg_worker_runs_notify_insert ON archive_worker_runs;
        DROP FUNCTION IF EXISTS archive_notify_runner();
        DROP FUNCTION IF EXISTS archive_notify_run();
        """
    )
