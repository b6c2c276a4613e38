"""GPU devices: the CUDA exit reasons of a run (cuda-error, cuda-oom).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

A child that dies of a CUDA error ends FAILED with ``exit_reason`` ``cuda-error`` (a device-side
assert, an illegal memory access, a cuBLAS failure: the CUDA context is lost) or ``cuda-oom`` (CUDA out
of memory), distinct from ``oom`` (the kernel's OOM killer on host memory). The devices of a runner and
of its children live in the registry's jsonb columns (``devices``, ``children``) and the device of a run
in its jsonb ``metrics``: no other column changes.

The downgrade folds the two reasons back into the older vocabulary (``cuda-oom`` -> ``oom`` would be
wrong: it was not the OOM killer), so both become ``exception``; the error text still names them.
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD = "'exception', 'signal', 'oom', 'timeout', 'lease-lost', 'runner-stopped', 'cancelled', 'cancel-forced'"
NEW = OLD + ", 'cuda-error', 'cuda-oom'"


def upgrade() -> None:
    op.execute(
        f"""
        ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason;
        ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason CHECK (exit_reason IN ({NEW}));
        """
    )


def downgrade() -> None:
    op.execute(
        f"""
        UPDATE archive_worker_runs SET exit_reason = 'exception' WHERE exit_reason IN ('cuda-error', 'cuda-oom');
        ALTER TABLE archive_worker_runs DROP CONSTRAINT ck_run_exit_reason;
        ALTER TABLE archive_worker_runs ADD CONSTRAINT ck_run_exit_reason CHECK (exit_reason IN ({OLD}));
        """
    )
