"""Flow versions (SPEC §12): ``flow_versions`` holds every version of a flow's runnable content
(graph, cron, errorFlowId); ``flows.history_version`` names the current one and
``executions.history_version`` the one an execution ran. Every existing flow gets version 1
(its content as stored, no author) and every existing execution of it names version 1.

Plain ADD COLUMN (no batch copy on SQLite: a table copy would drop the search triggers of
migration 0008).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_ID = sa.String(length=24)


def upgrade() -> None:
    op.create_table(
        "flow_versions",
        sa.Column("flow_id", _ID, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("error_flow_id", _ID, nullable=True),
        sa.Column("author", _ID, nullable=True),
        sa.Column("restored_from", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("flow_id", "number", name=op.f("pk_flow_versions")),
    )
    op.add_column("flows", sa.Column("history_version", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("executions", sa.Column("history_version", sa.Integer(), nullable=True))
    op.execute(
        "INSERT INTO flow_versions (flow_id, number, graph, cron, error_flow_id, author, created_at) "
        "SELECT id, 1, graph, cron, error_flow_id, NULL, updated_at FROM flows"
    )
    op.execute(
        "UPDATE executions SET history_version = 1"
        " WHERE EXISTS (SELECT 1 FROM flows f WHERE f.id = executions.flow_id)"
    )


def downgrade() -> None:
    op.drop_column("executions", "history_version")
    op.drop_column("flows", "history_version")
    op.drop_table("flow_versions")
