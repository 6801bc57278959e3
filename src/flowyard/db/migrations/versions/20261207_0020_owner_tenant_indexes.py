"""owner indexes by tenant: a user owner's executions keyed by the tenant they were recorded on

``ix_executions_owner_id (owner_user, id, tenant, flow_id)`` and its status twin become
``(owner_user, tenant, id, flow_id)`` and ``(owner_user, tenant, status, id, flow_id)`` over
the rows with a tenant, and ``(owner_user, id, flow_id)``, ``(owner_user, status, id, flow_id)``
over those without (PostgreSQL does not take ``tenant IS NULL`` as an equality that keeps
``id`` in order, so a NULL key would make every tenantless owner's page sort). A
member's executions charged to it outside its tenant (few) are read as one index range per
tenant, found by a loose scan of the index, instead of walking every execution charged to it
(the many inside its tenant) for the few outside. Each row is in one of the two pairs, and the
entries are no wider, so no storage is added.

Plain CREATE/DROP INDEX (no batch copy on SQLite: a table copy would drop the search triggers
of migration 0008).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 03:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_WITH, _WITHOUT = sa.text("tenant IS NOT NULL"), sa.text("tenant IS NULL")
_NEW = [
    ("ix_executions_owner_tenant_id", ["owner_user", "tenant", "id", "flow_id"], _WITH),
    ("ix_executions_owner_tenant_status_id", ["owner_user", "tenant", "status", "id", "flow_id"], _WITH),
    ("ix_executions_tenantless_owner_id", ["owner_user", "id", "flow_id"], _WITHOUT),
    ("ix_executions_tenantless_owner_status_id", ["owner_user", "status", "id", "flow_id"], _WITHOUT),
]
_OLD = [
    ("ix_executions_owner_id", ["owner_user", "id", "tenant", "flow_id"]),
    ("ix_executions_owner_status_id", ["owner_user", "status", "id", "tenant", "flow_id"]),
]


def upgrade() -> None:
    for name, columns, where in _NEW:
        op.create_index(name, "executions", columns, unique=False, postgresql_where=where, sqlite_where=where)
    for name, _columns in _OLD:
        op.drop_index(name, table_name="executions")


def downgrade() -> None:
    for name, columns in _OLD:
        op.create_index(name, "executions", columns, unique=False)
    for name, _columns, _where in _NEW:
        op.drop_index(name, table_name="executions")
