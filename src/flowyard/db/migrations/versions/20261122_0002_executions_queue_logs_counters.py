"""executions queue logs counters

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 04:33:49.690606
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "component_day_counts",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("component_id", sa.String(length=200), nullable=False),
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("steps", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "component_id", "flow_id", name=op.f("pk_component_day_counts")),
    )
    op.create_table(
        "executions",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("flow_version", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("owner_user", sa.String(length=64), nullable=True),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("input", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_executions")),
        sa.UniqueConstraint("flow_id", "scheduled_for", name=op.f("uq_executions_flow_id_scheduled_for")),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.create_index("ix_executions_flow_id_id", ["flow_id", "id"], unique=False)
        batch_op.create_index("ix_executions_flow_status", ["flow_id", "status"], unique=False)
        batch_op.create_index("ix_executions_status_id", ["status", "id"], unique=False)
        batch_op.create_index("ix_executions_status_lease", ["status", "lease_expires_at"], unique=False)
        batch_op.create_index("ix_executions_tenant_id", ["tenant", "id"], unique=False)

    op.create_table(
        "flow_day_counts",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("flow_name", sa.String(length=200), nullable=True),
        sa.Column("executions", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "flow_id", name=op.f("pk_flow_day_counts")),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("execution_id", sa.String(length=24), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("flow_id", "key", name=op.f("pk_idempotency_keys")),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_idempotency_keys_created_at"), ["created_at"], unique=False)

    op.create_table(
        "logs",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.Column("level", sa.String(length=8), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("flow_id", sa.String(length=24), nullable=True),
        sa.Column("execution_id", sa.String(length=24), nullable=True),
        sa.Column("step_id", sa.String(length=64), nullable=True),
        sa.Column("component_id", sa.String(length=200), nullable=True),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_logs")),
    )
    with op.batch_alter_table("logs", schema=None) as batch_op:
        batch_op.create_index("ix_logs_execution_id", ["execution_id", "id"], unique=False)
        batch_op.create_index("ix_logs_tenant_flow_id", ["tenant", "flow_id", "id"], unique=False)
        batch_op.create_index("ix_logs_tenant_id", ["tenant", "id"], unique=False)
        batch_op.create_index("ix_logs_tenant_level_id", ["tenant", "level", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_logs_timestamp"), ["timestamp"], unique=False)

    op.create_table(
        "execution_steps",
        sa.Column("execution_id", sa.String(length=24), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("component_id", sa.String(length=200), nullable=True),
        sa.Column("function", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("messages_in", sa.Integer(), nullable=False),
        sa.Column("messages_out", sa.Integer(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["executions.id"],
            name=op.f("fk_execution_steps_execution_id_executions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("execution_id", "node_id", name=op.f("pk_execution_steps")),
    )


def downgrade() -> None:

    op.drop_table("execution_steps")
    with op.batch_alter_table("logs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_logs_timestamp"))
        batch_op.drop_index("ix_logs_tenant_level_id")
        batch_op.drop_index("ix_logs_tenant_id")
        batch_op.drop_index("ix_logs_tenant_flow_id")
        batch_op.drop_index("ix_logs_execution_id")

    op.drop_table("logs")
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_keys_created_at"))

    op.drop_table("idempotency_keys")
    op.drop_table("flow_day_counts")
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index("ix_executions_tenant_id")
        batch_op.drop_index("ix_executions_status_lease")
        batch_op.drop_index("ix_executions_status_id")
        batch_op.drop_index("ix_executions_flow_status")
        batch_op.drop_index("ix_executions_flow_id_id")

    op.drop_table("executions")
    op.drop_table("component_day_counts")
