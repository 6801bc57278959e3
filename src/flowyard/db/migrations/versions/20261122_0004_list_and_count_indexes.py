"""list and count indexes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 05:38:12.009508
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:

    with op.batch_alter_table("component_day_counts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_component_day_counts_tenant",
            ["tenant", "day", "component_id", "flow_id", "steps"],
            unique=False,
        )

    with op.batch_alter_table("flow_day_counts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_flow_day_counts_tenant",
            ["tenant", "day", "flow_id", "user_id", "flow_name", "executions"],
            unique=False,
        )

    with op.batch_alter_table("flows", schema=None) as batch_op:
        batch_op.create_index("ix_flows_status_created_at_id", ["status", "created_at", "id"], unique=False)
        batch_op.create_index("ix_flows_status_updated_at_id", ["status", "updated_at", "id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("flows", schema=None) as batch_op:
        batch_op.drop_index("ix_flows_status_updated_at_id")
        batch_op.drop_index("ix_flows_status_created_at_id")

    with op.batch_alter_table("flow_day_counts", schema=None) as batch_op:
        batch_op.drop_index("ix_flow_day_counts_tenant")

    with op.batch_alter_table("component_day_counts", schema=None) as batch_op:
        batch_op.drop_index("ix_component_day_counts_tenant")
