"""login throttle; failed attempts are counted there, not on the user

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 19:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_throttle",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_throttle")),
    )
    with op.batch_alter_table("login_throttle", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_login_throttle_window_start"), ["window_start"], unique=False)
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("failed_login_attempts")


def downgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("failed_login_attempts", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("login_throttle", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_throttle_window_start"))
    op.drop_table("login_throttle")
