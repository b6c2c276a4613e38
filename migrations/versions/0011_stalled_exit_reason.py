"""A run whose child stalled says so: exit_reason 'stalled'.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

The runner stops a child that sends no message and uses no CPU for its stall timeout, after dumping its
Python stack into the run's error (runner.stall, decision 0111). That is neither an exception of the
worker nor a signal from outside: its own exit reason lets the Failures page and a retry policy tell a
hung run from a crashed one.
"""
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: The reasons as migration 0007 left them (0008 and 0009 did not change them).
_OLD = ("'exception', 'signal', 'oom', 'timeout', 'lease-lost', 'runner-stopped', 'cancelled', 'cancel-forced', "
        "'cuda-error', 'cuda-oom', 'configuration'")


def upgrade() -> None:
    op.execute(
        f"""
        ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason;
        ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason
            CHECK (exit_reason IN ({_OLD}, 'stalled'));
        """
    )


def downgrade() -> None:
    # A stalled run is, to the old schema, one the runner stopped with a signal.
    op.execute(
        f"""
        UPDATE archive_worker_runs SET exit_reason = 'signal' WHERE exit_reason = 'stalled';
        ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason;
        ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason CHECK (exit_reason IN ({_OLD}));
        """
    )
