"""flow counts: ``meta.total`` of the flow lists from counts kept with the flows

``flow_counts (user_id, tenant, status, type, n)``: how many flows have the owner entry
``user user_id`` (``tenant = ''``), ``tenant tenant`` (``user_id = ''``), both, or any
(``'', ''``), per status and type. Kept by ``flows/counts.py`` in the transactions that write
flows; filled here from ``flow_owners`` and ``flows``.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 06:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_FILL = """
INSERT INTO flow_counts (user_id, tenant, status, type, n)
SELECT '', '', f.status, f.type, count(*) FROM flows f GROUP BY f.status, f.type
UNION ALL
SELECT o.owner_id, '', f.status, f.type, count(*)
  FROM flow_owners o JOIN flows f ON f.id = o.flow_id
 WHERE o.owner_type = 'user' GROUP BY o.owner_id, f.status, f.type
UNION ALL
SELECT '', o.owner_id, f.status, f.type, count(*)
  FROM flow_owners o JOIN flows f ON f.id = o.flow_id
 WHERE o.owner_type = 'tenant' GROUP BY o.owner_id, f.status, f.type
UNION ALL
SELECT u.owner_id, t.owner_id, f.status, f.type, count(*)
  FROM flow_owners u
  JOIN flow_owners t ON t.flow_id = u.flow_id AND t.owner_type = 'tenant'
  JOIN flows f ON f.id = u.flow_id
 WHERE u.owner_type = 'user' GROUP BY u.owner_id, t.owner_id, f.status, f.type
"""


def upgrade() -> None:
    op.create_table(
        "flow_counts",
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "tenant", "status", "type", name=op.f("pk_flow_counts")),
    )
    op.execute(_FILL)


def downgrade() -> None:
    op.drop_table("flow_counts")
