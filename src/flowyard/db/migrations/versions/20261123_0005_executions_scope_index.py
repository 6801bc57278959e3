"""executions scope index

Executions are listed by flow visibility; the executions of deleted flows by the tenant (or,
without one, the user owner) recorded on them, checked against the flows table. The index
(tenant, owner_user, flow_id, id) answers that from the index alone and replaces
(tenant, id), which served only the former tenant-column scope.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 19:58:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.create_index("ix_executions_scope", ["tenant", "owner_user", "flow_id", "id"], unique=False)
        batch_op.drop_index("ix_executions_tenant_id")


def downgrade() -> None:
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.create_index("ix_executions_tenant_id", ["tenant", "id"], unique=False)
        batch_op.drop_index("ix_executions_scope")
