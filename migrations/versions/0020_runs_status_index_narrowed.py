"""The runs list's status index narrowed to the rare endings: one B-tree entry fewer per write (issue 29,
decision 0391).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

``ix_worker_runs_status_id (status, id DESC)`` took an entry at each of a run's three writes (the enqueue,
the claim, the finish: each changes ``status``, so none is a HOT update), ~240 B of WAL of a cycle's ~2,150
at 1M history, for one reader: the runs list filtered by status. The other readers of a status find it
elsewhere: the active rows (QUEUED, RUNNING) are exactly the slot index ``uq_worker_run_active``'s, and
SUCCESS is most of the history, which a backward walk of the primary key meets at once. What needs an
index of its own is a rare ending (FAILED, INTERRUPTED, CANCELLED) in a long history: the new partial index
holds those rows only, an entry once per such finish and none for a successful run.

Expand-only as decision 0125 reads it: a non-unique index is no fact the previous release's code relies
on (its queries return the same rows; a filtered list of the previous release's panel finds them through
the same indexes, the active ones and the endings, when its plan sees the statuses). Downgrade re-creates
the old index.
"""
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE INDEX IF NOT EXISTS ix_worker_runs_ending_id ON archive_worker_runs (status, id DESC)
            WHERE status IN ('FAILED', 'INTERRUPTED', 'CANCELLED');
        DROP INDEX IF EXISTS ix_worker_runs_status_id;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        CREATE INDEX IF NOT EXISTS ix_worker_runs_status_id ON archive_worker_runs (status, id DESC);
        DROP INDEX IF EXISTS ix_worker_runs_ending_id;
        """
    )
