"""Time-ordered public run ids: new runs get a UUIDv7-style ``run_id`` made by the database.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

A random UUIDv4 lands each insert (and each non-HOT update of a run) on a random leaf of the unique
index ``archive_worker_runs_run_id_key``; after a checkpoint each of those leaves is written whole to
the WAL (a full-page image), which was most of the WAL of an enqueue+claim+finish cycle. A UUIDv7
(RFC 9562: 48 bits of Unix milliseconds, then 12 bits of sub-millisecond fraction, then 62 random bits)
puts every new run next to the previous one (the leaf that holds the newest ids), so a cycle touches a
hot page instead of a cold one.

The value is made by the database (``clock_timestamp()``: the database's clock, never a client's), so
run ids are ordered like their ``queued_at``, also across API processes and hosts. The 12-bit
fraction (RFC 9562 method 3) keeps sequential runs ordered within one millisecond. Existing rows keep
their ids (a public id never changes); only the column default changes.

Also: ``ix_runners_last_heartbeat`` goes. No query filters or sorts the registry by
``last_heartbeat_at``, and an index on the column every heartbeat changes makes each beat a non-HOT
update (a new entry in every index of the table, and a table that autovacuum keeps revisiting). Without
it a beat is a HOT update, pruned in place.

The registry table is re-analysed far less often (``autovacuum_analyze_threshold`` 10000): every
heartbeat counts as a modification, so by the default threshold (50 + 10% of the rows) ten runners made
a table of a few rows due for an autoanalyze (pg_statistic rewrites, WAL) about every 75 s, although a
beat changes nothing statistics describe.

And ``ix_worker_runs_claim`` (QUEUED) and ``ix_worker_runs_lease`` (RUNNING) go: with one active run
per worker (``uq_worker_run_active``, the slot), the active rows are at most one per worker and
``uq_worker_run_active`` (QUEUED or RUNNING) already holds exactly them, as ``ix_worker_runs_runner``
holds the RUNNING ones; the claim and expiry read those (or the QUEUED range of
``ix_worker_runs_status_id``) at a cost that does not grow with history. Each extra index was one more
index entry (and WAL record) per enqueue or claim.
"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UUID_V7_FUNCTION = r"""
CREATE FUNCTION archive_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $v7$
SELECT encode(
         substring(int8send(t.us / 1000) FROM 3)
      || substring(int4send((28672 | ((t.us % 1000) * 4096 / 1000))::integer) FROM 3)
      || substring(uuid_send(gen_random_uuid()) FROM 9),
       'hex')::uuid
  FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) AS t
$v7$;
COMMENT ON FUNCTION archive_uuid_v7() IS
  'A UUIDv7 (RFC 9562, method 3: ms timestamp, 12-bit sub-ms fraction, random) from clock_timestamp()';
"""


def upgrade() -> None:
    op.execute(UUID_V7_FUNCTION)
    op.execute("ALTER TABLE archive_worker_runs ALTER COLUMN run_id SET DEFAULT archive_uuid_v7()")
    op.execute("DROP INDEX IF EXISTS ix_runners_last_heartbeat")
    op.execute("DROP INDEX IF EXISTS ix_worker_runs_claim")
    op.execute("DROP INDEX IF EXISTS ix_worker_runs_lease")
    op.execute("ALTER TABLE archive_worker_runners SET (autovacuum_analyze_threshold = 10000)")


def downgrade() -> None:
    op.execute("ALTER TABLE archive_worker_runners RESET (autovacuum_analyze_threshold)")
    op.execute("CREATE INDEX IF NOT EXISTS ix_worker_runs_lease ON archive_worker_runs (lease_expires_at) "
               "WHERE status = 'RUNNING'")
    op.execute("CREATE INDEX IF NOT EXISTS ix_worker_runs_claim ON archive_worker_runs (queued_at, id) "
               "WHERE status = 'QUEUED'")
    op.execute("CREATE INDEX IF NOT EXISTS ix_runners_last_heartbeat ON archive_worker_runners (last_heartbeat_at)")
    op.execute("ALTER TABLE archive_worker_runs ALTER COLUMN run_id SET DEFAULT gen_random_uuid()")
    op.execute("DROP FUNCTION IF EXISTS archive_uuid_v7()")
