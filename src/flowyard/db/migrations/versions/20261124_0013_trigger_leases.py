"""event-trigger leases: one consuming engine process per flow

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23 23:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trigger_leases",
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("flow_version", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("subscribed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("problem", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("flow_id", name=op.f("pk_trigger_leases")),
    )


def downgrade() -> None:
    op.drop_table("trigger_leases")
