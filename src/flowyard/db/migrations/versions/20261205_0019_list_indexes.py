"""list indexes: every listing of executions and logs pages from one index range, newest first

A non-admin's executions are listed from the tenant and the user owner recorded on each
execution when it was created (and only while its flow is visible to the caller, a probe of
``flow_owners`` from the index alone: ``flow_id`` rides along in each index); the executions
of a deleted flow leave those lists with the flow's owners. Each filter
(``status``, ``flowId``, both) has its index in id order:

- ``(tenant, id, flow_id)``, ``(tenant, status, id, flow_id)`` for a tenant's members;
- ``(owner_user, id, tenant, flow_id)``, ``(owner_user, status, id, tenant, flow_id)`` for the
  user owner (a tenantless user, or a member who owns a flow of no or another tenant);
- ``(flow_id, id, tenant, owner_user)`` replaces ``(flow_id, id)`` and
  ``(flow_id, status, id, tenant, owner_user)`` replaces ``(flow_id, status)`` (they serve the
  same lookups, and a member's ``filter[flowId]`` from the index alone);
- ``ix_executions_scope`` (the per-row search for executions of deleted flows) goes;
- logs: ``(tenant, step_id, id)`` for ``filter[stepId]``, and
  ``(user_id, id) WHERE tenant IS NULL`` for a tenantless caller's logs.

Plain CREATE/DROP INDEX (no batch copy on SQLite: a table copy would drop the search triggers
of migration 0008).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_EXECUTIONS = [
    ("ix_executions_flow_id", ["flow_id", "id", "tenant", "owner_user"]),
    ("ix_executions_flow_status_id", ["flow_id", "status", "id", "tenant", "owner_user"]),
    ("ix_executions_tenant_id", ["tenant", "id", "flow_id"]),
    ("ix_executions_tenant_status_id", ["tenant", "status", "id", "flow_id"]),
    ("ix_executions_owner_id", ["owner_user", "id", "tenant", "flow_id"]),
    ("ix_executions_owner_status_id", ["owner_user", "status", "id", "tenant", "flow_id"]),
]
_REPLACED = {
    "ix_executions_flow_id_id": ["flow_id", "id"],
    "ix_executions_flow_status": ["flow_id", "status"],
    "ix_executions_scope": ["tenant", "owner_user", "flow_id", "id"],
}
_TENANTLESS = sa.text("tenant IS NULL")


def upgrade() -> None:
    for name, columns in _EXECUTIONS:
        op.create_index(name, "executions", columns, unique=False)
    for name in _REPLACED:
        op.drop_index(name, table_name="executions")
    op.create_index("ix_logs_tenant_step_id", "logs", ["tenant", "step_id", "id"], unique=False)
    op.create_index(
        "ix_logs_tenantless_user_id",
        "logs",
        ["user_id", "id"],
        unique=False,
        postgresql_where=_TENANTLESS,
        sqlite_where=_TENANTLESS,
    )


def downgrade() -> None:
    op.drop_index("ix_logs_tenantless_user_id", table_name="logs")
    op.drop_index("ix_logs_tenant_step_id", table_name="logs")
    for name, columns in _REPLACED.items():
        op.create_index(name, "executions", columns, unique=False)
    for name, _columns in reversed(_EXECUTIONS):
        op.drop_index(name, table_name="executions")
