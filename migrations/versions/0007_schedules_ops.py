"""A run that fails on its configuration says so: exit_reason 'configuration' (never retried).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Every entry point validates a request before writing it, so a configuration failure reaches a runner
only when something changed between the enqueue and the claim (the worker's settings, the runner's
catalogue, a model directory missing on the GPU host). Such a failure is its own exit reason, so the
scheduler's retry policy can leave it alone (a retry would fail the same way) and the Failures page can
tell it from a worker's exception.
"""
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: The reasons as migration 0004 left them (with the CUDA ones).
_OLD = ("'exception', 'signal', 'oom', 'timeout', 'lease-lost', 'runner-stopped', 'cancelled', 'cancel-forced', "
        "'cuda-error', 'cuda-oom'")


def upgrade() -> None:
    op.execute(
        f"""
        ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason;
        ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason
            CHECK (exit_reason IN ({_OLD}, 'configuration'));
        """
    )


def downgrade() -> None:
    # A 'configuration' failure is a failure the old schema calls an exception.
    op.execute(
        f"""
        UPDATE archive_worker_runs SET exit_reason = 'exception' WHERE exit_reason = 'configuration';
        ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason;
        ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason CHECK (exit_reason IN ({_OLD}));
        """
    )
