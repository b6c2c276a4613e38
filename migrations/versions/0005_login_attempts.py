"""Login attempts: the lockout moves out of auth_users into buckets claimed before a password is checked.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``auth_login_throttle`` holds one row per bucket: ``account`` (the SHA-256 of a normalised e-mail, known
or not, so an unknown address is counted exactly like a known one) or ``device`` (the SHA-256 of a device
cookie that a browser got from an earlier successful login). ``auth_devices`` binds a device cookie to
its user. See docs/security.md, "Login and lockout".

Kept for the previous release (expand/contract, decision 0125): the three lockout columns of
``auth_users`` (``failed_attempts``, ``lockout_count``, ``locked_until``) stay. That release's API reads
and writes them on every login, and it keeps serving between ``scrinalia db upgrade`` and its own
replacement. Its lockouts are carried into the new buckets, not dropped: once here (every account with a
count or a lock gets its ``account`` bucket), and for every lockout it records after the upgrade by the
trigger ``trg_auth_users_carry_lockout``, so an account that release locked is still locked for this one.
This code never reads or writes the columns; the release after this one drops them and the trigger (its
contract step), declaring in that migration ``CONTRACT = ("column auth_users.failed_attempts integer",
"default auth_users.failed_attempts", ...)``: the facts of tests/foundation/schema_facts.py it removes.
"""
from alembic import op
from sqlalchemy import text

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE auth_login_throttle (
	scope TEXT NOT NULL,
	key_sha256 TEXT NOT NULL,
	attempts INTEGER DEFAULT 0 NOT NULL,
	lockout_count INTEGER DEFAULT 0 NOT NULL,
	locked_until TIMESTAMP WITH TIME ZONE,
	updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	PRIMARY KEY (scope, key_sha256),
	CONSTRAINT ck_auth_login_throttle_scope CHECK (scope IN ('account', 'device'))
);

CREATE INDEX ix_auth_login_throttle_updated ON auth_login_throttle (updated_at);

CREATE TABLE auth_devices (
	id BIGINT GENERATED ALWAYS AS IDENTITY,
	token_sha256 TEXT NOT NULL,
	user_id BIGINT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (token_sha256),
	FOREIGN KEY(user_id) REFERENCES auth_users (id) ON DELETE CASCADE
);

CREATE INDEX ix_auth_devices_user ON auth_devices (user_id);
"""

# {s}: the quoted schema of the tables. The bucket of an account is ``lockout.Bucket.account``: the SHA-256
# of the lower-cased e-mail, as ``users.user_columns`` computes it in SQL.
ACCOUNT_KEY = "pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.lower({email}), 'UTF8')), 'hex')"

# The previous release's state as buckets. Its ``failed_attempts`` is the current series (0 once a lock is
# set), its ``lockout_count`` the locks so far, its ``locked_until`` the lock: the buckets' own meanings.
CARRY_OVER = """
INSERT INTO {s}.auth_login_throttle (scope, key_sha256, attempts, lockout_count, locked_until)
SELECT 'account', {key}, u.failed_attempts, u.lockout_count, u.locked_until
  FROM {s}.auth_users AS u
 WHERE u.failed_attempts > 0 OR u.lockout_count > 0 OR u.locked_until IS NOT NULL;
"""

# What the previous release writes after the upgrade, carried into the account's bucket: its successful
# login (or an administrator's reset) clears all three, which releases the bucket as this release's
# success does; a failure or a lock is merged into the bucket, never shortening a lock either side set.
CARRY_TRIGGER = """
CREATE FUNCTION {s}.auth_users_carry_lockout() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $carry$
BEGIN
  IF NEW.failed_attempts = 0 AND NEW.lockout_count = 0 AND NEW.locked_until IS NULL THEN
    DELETE FROM {s}.auth_login_throttle AS t WHERE t.scope = 'account' AND t.key_sha256 = {new_key};
  ELSE
    INSERT INTO {s}.auth_login_throttle AS t (scope, key_sha256, attempts, lockout_count, locked_until)
    VALUES ('account', {new_key}, NEW.failed_attempts, NEW.lockout_count, NEW.locked_until)
    ON CONFLICT (scope, key_sha256) DO UPDATE SET
      attempts      = CASE WHEN t.locked_until > now() THEN t.attempts ELSE EXCLUDED.attempts END,
      lockout_count = GREATEST(t.lockout_count, EXCLUDED.lockout_count),
      locked_until  = GREATEST(t.locked_until, EXCLUDED.locked_until),
      updated_at    = now();
  END IF;
  RETURN NULL;
END
$carry$;

CREATE TRIGGER trg_auth_users_carry_lockout
  AFTER UPDATE OF failed_attempts, lockout_count, locked_until ON {s}.auth_users
  FOR EACH ROW
  WHEN ((OLD.failed_attempts, OLD.lockout_count, OLD.locked_until)
        IS DISTINCT FROM (NEW.failed_attempts, NEW.lockout_count, NEW.locked_until))
  EXECUTE FUNCTION {s}.auth_users_carry_lockout();
"""

# Back to the previous release's columns: the account buckets' locks (a bucket refusing claims is a lock
# with a fresh series in the old counting).
CARRY_BACK = """
DROP TRIGGER IF EXISTS trg_auth_users_carry_lockout ON {s}.auth_users;
DROP FUNCTION IF EXISTS {s}.auth_users_carry_lockout();
UPDATE {s}.auth_users AS u
   SET failed_attempts = CASE WHEN t.locked_until > now() THEN 0 ELSE t.attempts END,
       lockout_count = t.lockout_count, locked_until = t.locked_until
  FROM {s}.auth_login_throttle AS t
 WHERE t.scope = 'account' AND t.key_sha256 = {key};
DROP TABLE IF EXISTS {s}.auth_devices, {s}.auth_login_throttle;
"""

_SCHEMA = text("SELECT pg_catalog.quote_ident(current_schema())")


def upgrade() -> None:
    s = op.get_bind().execute(_SCHEMA).scalar_one()
    op.execute(UPGRADE)
    op.execute(CARRY_OVER.format(s=s, key=ACCOUNT_KEY.format(email="u.email")))
    op.execute(CARRY_TRIGGER.format(s=s, new_key=ACCOUNT_KEY.format(email="NEW.email")))


def downgrade() -> None:
    s = op.get_bind().execute(_SCHEMA).scalar_one()
    op.execute(CARRY_BACK.format(s=s, key=ACCOUNT_KEY.format(email="u.email")))
