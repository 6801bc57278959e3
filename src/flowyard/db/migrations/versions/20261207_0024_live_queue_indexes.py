"""live queue indexes: the queue's indexes hold the queued and running rows only

Storage per execution (issue 19). Two of the executions' indexes served the queue and held
every row, finished or not (~100 bytes an execution on SQLite at 100,000 executions):

- ``ix_executions_status_queue_group_id (status, queue_group, id)``, the fair claim's groups
  and their oldest rows, and each group's running count: replaced by two partial indexes of
  the same columns, one ``WHERE status = 'queued'`` and one ``WHERE status = 'running'`` (the
  status still leads, so SQLite's planner, without statistics, prefers them to
  ``ix_executions_status_id``);
- ``ix_executions_status_lease (status, lease_expires_at)``, the reaper's expired leases:
  dropped; the reaper reads the running rows (few) from ``ix_executions_status_id``.

And ``ix_executions_parent (parent_execution_id)`` holds only the rows that have a caller
(``WHERE parent_execution_id IS NOT NULL``): a sub-flow's children, not every execution's NULL.

Plain CREATE/DROP INDEX (no batch copy on SQLite).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 22:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_QUEUED = sa.text("status = 'queued'")
_RUNNING = sa.text("status = 'running'")
_CALLED = sa.text("parent_execution_id IS NOT NULL")


def _partial(name: str, columns: list[str], where: sa.TextClause) -> None:
    op.create_index(name, "executions", columns, unique=False, postgresql_where=where, sqlite_where=where)


def upgrade() -> None:
    _partial("ix_executions_queued_group_id", ["status", "queue_group", "id"], _QUEUED)
    _partial("ix_executions_running_group_id", ["status", "queue_group", "id"], _RUNNING)
    op.drop_index("ix_executions_status_queue_group_id", table_name="executions")
    op.drop_index("ix_executions_status_lease", table_name="executions")
    op.drop_index("ix_executions_parent", table_name="executions")
    _partial("ix_executions_parent", ["parent_execution_id"], _CALLED)


def downgrade() -> None:
    op.drop_index("ix_executions_parent", table_name="executions")
    op.create_index("ix_executions_parent", "executions", ["parent_execution_id"], unique=False)
    op.create_index("ix_executions_status_lease", "executions", ["status", "lease_expires_at"], unique=False)
    op.create_index(
        "ix_executions_status_queue_group_id", "executions", ["status", "queue_group", "id"], unique=False
    )
    op.drop_index("ix_executions_running_group_id", table_name="executions")
    op.drop_index("ix_executions_queued_group_id", table_name="executions")
