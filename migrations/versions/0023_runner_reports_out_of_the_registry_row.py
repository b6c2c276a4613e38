"""What a runner reports of its host in a row of its own: ``archive_worker_runner_reports`` (issue 29,
decision 0395).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-08

The heartbeat rewrites its runner's registry row at every beat (``last_heartbeat_at``, the children's
snapshot), and while something pins the xmin horizon every version stays. Each one copied what the runner
reported once, at registration or when its warm models changed: its devices (migration 0004), the model
directories it sees (0014) and its warm models (0019), ~900 B on a GPU host, under the ~2 KB at which
PostgreSQL would move them out of line. ``register`` now writes the devices and what it sees here, and the
heartbeat writes the warm models here when they change; the registry's row keeps what changes with the
beat.

Expand only. The registry's own columns stay; every reader of this release takes this row's value, then
the registry row's (a runner registered before this migration has no row here). The previous release knows
none of the three columns.

Every role that may renew a runner's row (UPDATE on ``children``: the runner roles of ``scrinalia db
runner-role``) may insert here (its registration) and update the warm models, so no grant needs running
again by hand.
"""
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE archive_worker_runner_reports (
            runner_id uuid PRIMARY KEY REFERENCES archive_worker_runners (runner_id) ON DELETE CASCADE,
            devices jsonb,
            sees jsonb,
            warm jsonb
        );
        DO $grant$
        DECLARE grantee text;
        BEGIN
            FOR grantee IN
                SELECT DISTINCT p.grantee FROM information_schema.column_privileges p
                 WHERE p.table_schema = current_schema() AND p.table_name = 'archive_worker_runners'
                   AND p.column_name = 'children' AND p.privilege_type = 'UPDATE'
                   AND p.grantee <> current_user
            LOOP
                EXECUTE format('GRANT SELECT, INSERT (runner_id, devices, sees), UPDATE (warm) '
                               'ON archive_worker_runner_reports TO %I', grantee);
            END LOOP;
        END
        $grant$;
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS archive_worker_runner_reports")
