"""Failures and waiting (SPEC §11) and sub-flows (§12): the columns they need.

- ``executions.resume_at``: when a ``waiting`` execution is due (a retry wait, a long delay, a
  join or a sub-flow it waits for); ``ix_executions_waiting_due`` is a partial index on it over
  the waiting rows only, so the resumer finds due executions with an index probe, however long
  the history is.
- ``executions.state``: the continuation a parked or replayed execution starts from
  (``flowyard.queue.continuation``); NULL for one that starts from its trigger.
- ``executions.retry_of`` / ``rerun_of``: the execution a replay was made from.
- ``executions.parent_execution_id``: the execution whose ``flow`` step started this one.
- ``flows.error_flow_id``: the flow started when one of this flow's executions fails.

Plain ADD COLUMN (no batch copy on SQLite: a table copy would drop the search triggers of
migration 0008).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 04:20:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_ID = sa.String(length=24)


def _json() -> sa.types.TypeEngine[Any]:
    # TEXT on SQLite (any JSON value keeps its text: migration 0014), json on PostgreSQL.
    return sa.Text() if op.get_bind().dialect.name == "sqlite" else sa.JSON()


def upgrade() -> None:
    op.add_column("executions", sa.Column("resume_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("executions", sa.Column("state", _json(), nullable=True))
    op.add_column("executions", sa.Column("retry_of", _ID, nullable=True))
    op.add_column("executions", sa.Column("rerun_of", _ID, nullable=True))
    op.add_column("executions", sa.Column("parent_execution_id", _ID, nullable=True))
    op.create_index(
        "ix_executions_waiting_due",
        "executions",
        ["resume_at"],
        postgresql_where=sa.text("status = 'waiting'"),
        sqlite_where=sa.text("status = 'waiting'"),
    )
    op.create_index("ix_executions_parent", "executions", ["parent_execution_id"])
    op.add_column("flows", sa.Column("error_flow_id", _ID, nullable=True))


def downgrade() -> None:
    op.drop_column("flows", "error_flow_id")
    op.drop_index("ix_executions_parent", table_name="executions")
    op.drop_index("ix_executions_waiting_due", table_name="executions")
    for column in ("parent_execution_id", "rerun_of", "retry_of", "state", "resume_at"):
        op.drop_column("executions", column)
