"""Templates get ``shared`` (SPEC §4, issue 22): a template with no owners is now seen by
administrators only unless it is shared. Templates stored without owners were seen by every
holder of ``flowTemplates.read``; they are marked shared so they stay visible as they were.
The downgrade drops the column (an unshared ownerless template then becomes global again).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 04:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("templates", sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute(
        "UPDATE templates SET shared = TRUE WHERE NOT EXISTS "
        "(SELECT 1 FROM template_owners o WHERE o.template_id = templates.id)"
    )


def downgrade() -> None:
    op.drop_column("templates", "shared")
