"""What a runner sees: archive_worker_runners.sees (the model directories on its host).

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-02

A model directory lives on the runner's host, which the API cannot see; a daemon reports at
registration the directories it sees (``{"model_dirs": [...], "model_roots": [...]}``) so the Settings
page can say when a path is unknown to every online runner (decision 0145). Expand only: the column has
a default, so a runner of the previous release registers as before (and reports nothing). Every role that
may register a runner (INSERT on ``capabilities``: the runner roles of ``scrinalia db runner-role``) may
insert this column too, so no grant needs to be run again by hand.
"""
from alembic import op

revision = "0014"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE archive_worker_runners ADD COLUMN IF NOT EXISTS sees jsonb NOT NULL DEFAULT '{}'::jsonb;
        DO $grant$
        DECLARE grantee text;
        BEGIN
            FOR grantee IN
                SELECT DISTINCT p.grantee FROM information_schema.column_privileges p
                 WHERE p.table_schema = current_schema() AND p.table_name = 'archive_worker_runners'
                   AND p.column_name = 'capabilities' AND p.privilege_type = 'INSERT'
                   AND p.grantee <> current_user
            LOOP
                EXECUTE format('GRANT INSERT (sees) ON archive_worker_runners TO %I', grantee);
            END LOOP;
        END
        $grant$;
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE archive_worker_runners DROP COLUMN IF EXISTS sees")
