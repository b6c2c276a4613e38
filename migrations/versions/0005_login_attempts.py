"""Login attempts: the lockout moves out of auth_users into buckets claimed before a password is checked.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``auth_login_throttle`` holds one row per bucket: ``account`` (the SHA-256 of a normalised e-mail, known
or not, so an unknown address is counted exactly like a known one) or ``device`` (the SHA-256 of a device
cookie that a browser got from an earlier successful login). ``auth_devices`` binds a device cookie to
its user. The three lockout columns of ``auth_users`` are dropped: the account's lock is its bucket.
See docs/security.md, "Login and lockout".
"""
from alembic import op

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

ALTER TABLE auth_users DROP COLUMN failed_attempts, DROP COLUMN lockout_count, DROP COLUMN locked_until;
"""

DOWNGRADE = """
ALTER TABLE auth_users
	ADD COLUMN failed_attempts INTEGER DEFAULT 0 NOT NULL,
	ADD COLUMN lockout_count INTEGER DEFAULT 0 NOT NULL,
	ADD COLUMN locked_until TIMESTAMP WITH TIME ZONE;
DROP TABLE IF EXISTS auth_devices, auth_login_throttle;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
