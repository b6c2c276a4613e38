"""What a runner's fork server keeps warm: archive_worker_runners.warm (issue 29, decision 0381).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05

The fork server's warm models (decision 0340) live on the runner's host, which the API cannot see; the
runner's heartbeat now writes them into its registry row when they change (``{"models": [{model_class,
model_dir, dtype, bytes, workers}], "bytes", "limit_bytes"}``), so /metrics reports the memory per warm
model. Expand only: the column has a default, so a runner of the previous release heartbeats as before
(and reports nothing). Every role that may renew a runner's row (UPDATE on ``children``: the runner roles
of ``scrinalia db runner-role``) may update this column too, so no grant needs to be run again by hand.
"""
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE archive_worker_runners ADD COLUMN IF NOT EXISTS warm jsonb NOT NULL DEFAULT '{}'::jsonb;
        DO $grant$
        DECLARE grantee text;
        BEGIN
            FOR grantee IN
                SELECT DISTINCT p.grantee FROM information_schema.column_privileges p
                 WHERE p.table_schema = current_schema() AND p.table_name = 'archive_worker_runners'
                   AND p.column_name = 'children' AND p.privilege_type = 'UPDATE'
                   AND p.grantee <> current_user
            LOOP
                EXECUTE format('GRANT UPDATE (warm) ON archive_worker_runners TO %I', grantee);
            END LOOP;
        END
        $grant$;
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE archive_worker_runners DROP COLUMN IF EXISTS warm")
