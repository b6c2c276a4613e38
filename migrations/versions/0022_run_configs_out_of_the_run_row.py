"""A run's resolved configuration in a row of its own: ``archive_worker_run_configs`` (issue 29,
decision 0394).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-08

PostgreSQL writes a whole new version of a row at every UPDATE, and while something pins the xmin horizon
(a nightly pg_dump, an analyst's REPEATABLE READ session) no version written after the pin can be removed.
A run's row is rewritten all its life (the heartbeat's lease, the progress, the finish), and since
``record_start`` each of those versions carried the resolved configuration and options (decision 0090:
~1 KB for the embedding worker, under the ~2 KB at which PostgreSQL would move it out of line): ~1.8 KB
per heartbeat, where the row without them is ~230 B. ``record_start`` now writes them once, here; the run's
row keeps its engine and preset (a few bytes, and the row's update is the statement's fence).

Expand only. The runs' own ``config`` and ``options`` stay, and every reader of this release reads
``COALESCE`` of the run's column, then this row: a runner of the previous release, which runs on this
schema through an upgrade, still writes its runs' configuration into their rows, and those are read as
written. The previous release's API reads only the run's columns: through the upgrade's window it shows
no configuration for a run that a runner of this release started (engine and preset still show).

Every role that may record a run's start (UPDATE on the run's ``config``: the runner roles of ``scrinalia
db runner-role``) may insert here and read, so no grant needs running again by hand; each gets the
restrictive policy that ``scrinalia.db.roles`` keeps (a row only for a RUNNING run: a runner adds a
configuration to no finished run), the same as the role's policies on the runs.
"""
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE archive_worker_run_configs (
            run_id uuid PRIMARY KEY REFERENCES archive_worker_runs (run_id) ON DELETE CASCADE,
            config jsonb,
            options jsonb
        );
        ALTER TABLE archive_worker_run_configs ENABLE ROW LEVEL SECURITY;
        CREATE POLICY worker_run_configs_everyone ON archive_worker_run_configs USING (true) WITH CHECK (true);
        DO $grant$
        DECLARE grantee text;
        BEGIN
            FOR grantee IN
                SELECT DISTINCT p.grantee FROM information_schema.column_privileges p
                 WHERE p.table_schema = current_schema() AND p.table_name = 'archive_worker_runs'
                   AND p.column_name = 'config' AND p.privilege_type = 'UPDATE'
                   AND p.grantee <> current_user
            LOOP
                EXECUTE format('GRANT SELECT, INSERT (run_id, config, options) ON archive_worker_run_configs TO %I',
                               grantee);
                EXECUTE format('CREATE POLICY %I ON archive_worker_run_configs AS RESTRICTIVE FOR INSERT TO %I '
                               'WITH CHECK (EXISTS (SELECT 1 FROM archive_worker_runs AS r '
                               'WHERE r.run_id = archive_worker_run_configs.run_id AND r.status = ''RUNNING''))',
                               grantee || '__config_insert', grantee);
            END LOOP;
        END
        $grant$;
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS archive_worker_run_configs")
