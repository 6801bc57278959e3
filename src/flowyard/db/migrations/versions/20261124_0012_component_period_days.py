"""the days each component ran in a flow, one bit per day of its week and month rollup rows,
backfilled from the daily rows; in the tenant index so that a member's read is covered

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Per dialect, per period: (the SQL of its first day from a row's ``day``, the day's offset in
# it). ISO weeks start on Monday, months on the 1st (queue/periods.py).
PERIODS = {
    "sqlite": (
        ("week", "date(day, 'weekday 0', '-6 days')", "((CAST(strftime('%w', day) AS INTEGER) + 6) % 7)"),
        ("month", "date(day, 'start of month')", "(CAST(strftime('%d', day) AS INTEGER) - 1)"),
    ),
    "postgresql": (
        (
            "week",
            "CAST(date_trunc('week', CAST(day AS timestamp)) AS date)",
            "(CAST(extract(isodow FROM day) AS INTEGER) - 1)",
        ),
        (
            "month",
            "CAST(date_trunc('month', CAST(day AS timestamp)) AS date)",
            "(CAST(extract(day FROM day) AS INTEGER) - 1)",
        ),
    ),
}
OLD_INDEX = ["tenant", "period", "start", "component_id", "flow_id", "steps"]


def upgrade() -> None:
    op.add_column(
        "component_period_counts", sa.Column("days", sa.BigInteger(), server_default="0", nullable=False)
    )
    # A daily row is unique per (day, component, flow): the sum of its days' bits is their OR.
    bits = []
    for period, start, offset in PERIODS[op.get_bind().dialect.name]:
        bits.append(
            f"SELECT '{period}' AS period, {start} AS start, component_id, flow_id, "
            f"SUM(CAST(1 AS BIGINT) << {offset}) AS days FROM component_day_counts "
            f"GROUP BY {start}, component_id, flow_id"
        )
    op.execute(
        "UPDATE component_period_counts SET days = b.days "
        f"FROM ({' UNION ALL '.join(bits)}) AS b "
        "WHERE component_period_counts.period = b.period AND component_period_counts.start = b.start "
        "AND component_period_counts.component_id = b.component_id "
        "AND component_period_counts.flow_id = b.flow_id"
    )
    op.drop_index("ix_component_period_counts_tenant", table_name="component_period_counts")
    op.create_index(
        "ix_component_period_counts_tenant", "component_period_counts", [*OLD_INDEX, "days"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_component_period_counts_tenant", table_name="component_period_counts")
    op.create_index("ix_component_period_counts_tenant", "component_period_counts", OLD_INDEX, unique=False)
    # Not a batch operation: its copy of the table would lose WITHOUT ROWID on SQLite.
    op.execute("ALTER TABLE component_period_counts DROP COLUMN days")
