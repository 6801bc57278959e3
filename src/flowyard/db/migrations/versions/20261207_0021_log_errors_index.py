"""log errors index: ``showErrors`` reads a partial index of the error entries only

``ix_logs_tenant_level_id (tenant, level, id)`` held every entry (~140 bytes an execution at
three entries each) for one filter, ``showErrors`` (``level = 'error'``); it becomes
``ix_logs_tenant_errors_id (tenant, id) WHERE level = 'error'``, the same range in id order
for a tenant's errors, holding only them.

Plain CREATE/DROP INDEX (no batch copy on SQLite).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 03:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_ERRORS = sa.text("level = 'error'")


def upgrade() -> None:
    op.create_index(
        "ix_logs_tenant_errors_id",
        "logs",
        ["tenant", "id"],
        unique=False,
        postgresql_where=_ERRORS,
        sqlite_where=_ERRORS,
    )
    op.drop_index("ix_logs_tenant_level_id", table_name="logs")


def downgrade() -> None:
    op.create_index("ix_logs_tenant_level_id", "logs", ["tenant", "level", "id"], unique=False)
    op.drop_index("ix_logs_tenant_errors_id", table_name="logs")
