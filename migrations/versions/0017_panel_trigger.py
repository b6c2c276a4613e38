"""A run started in the panel says so: trigger PANEL (issue 28, decision 0323).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

The API wrote ``API`` for every run it enqueued, the panel's Run and Retry included. A run enqueued with
the browser's cookie session is now ``PANEL``; a script's bearer token stays ``API``.

Only an addition: a value appended to the enum (``ADD VALUE`` commits with the migration; nothing in this
transaction uses it). A release before this one refuses to start on this schema (its head is behind), so
none of its processes reads a PANEL row. The value is not removed on downgrade: PostgreSQL cannot drop an
enum value that rows may hold, and an unused value harms nothing.
"""
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TYPE worker_run_trigger ADD VALUE IF NOT EXISTS 'PANEL'")


def downgrade() -> None:
    pass  # see the module's docstring
