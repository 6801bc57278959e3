"""process heartbeats: a row per engine process, so a dead one's work is taken back in seconds

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 22:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "process_heartbeats",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_process_heartbeats")),
    )
    with op.batch_alter_table("process_heartbeats", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_process_heartbeats_beat_at"), ["beat_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("process_heartbeats", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_process_heartbeats_beat_at"))
    op.drop_table("process_heartbeats")
