"""fair queue groups and webhook rate buckets

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 19:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_rate_buckets",
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("flow_id", name=op.f("pk_webhook_rate_buckets")),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue_group", sa.String(length=80), nullable=True))
        batch_op.create_index(
            "ix_executions_status_queue_group_id", ["status", "queue_group", "id"], unique=False
        )
    # Unfinished rows join their group; finished ones never need one.
    op.execute(
        "UPDATE executions SET queue_group = CASE "
        "WHEN tenant IS NOT NULL THEN 't:' || tenant "
        "WHEN owner_user IS NOT NULL THEN 'u:' || owner_user ELSE '-' END "
        "WHERE status IN ('queued', 'running')"
    )


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index("ix_executions_status_queue_group_id")
        batch_op.drop_column("queue_group")
    op.drop_table("webhook_rate_buckets")
