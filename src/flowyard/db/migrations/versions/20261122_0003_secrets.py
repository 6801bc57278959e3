"""secrets

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 04:52:36.377489
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "secrets",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("owner_user", sa.String(length=24), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_secrets")),
    )
    with op.batch_alter_table("secrets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_secrets_owner_user"), ["owner_user"], unique=False)
        batch_op.create_index(batch_op.f("ix_secrets_tenant"), ["tenant"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("secrets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_secrets_tenant"))
        batch_op.drop_index(batch_op.f("ix_secrets_owner_user"))

    op.drop_table("secrets")
