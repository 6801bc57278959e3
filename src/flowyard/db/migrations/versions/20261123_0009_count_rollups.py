"""weekly and monthly rollups of the per-day counters, backfilled from the daily rows;
covering indexes of the daily rows by day

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 20:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# (period, the SQL of its first day from a row's ``day``) per dialect: ISO weeks start on
# Monday, months on the 1st (queue/periods.py).
PERIOD_STARTS = {
    "sqlite": (("week", "date(day, 'weekday 0', '-6 days')"), ("month", "date(day, 'start of month')")),
    "postgresql": (
        ("week", "CAST(date_trunc('week', CAST(day AS timestamp)) AS date)"),
        ("month", "CAST(date_trunc('month', CAST(day AS timestamp)) AS date)"),
    ),
}


def _backfill(table: str, keys: str, attributes: tuple[str, ...], counter: str, latest: bool) -> None:
    """Sum the daily rows into their weeks and months. The attributes are those of the period's
    latest day where the daily upsert replaces them (flows), of its earliest where it keeps the
    first ones (components), as the engine's writes would have left them."""
    source = table.replace("period", "day")
    order = "DESC" if latest else "ASC"
    selects = []
    for period, start in PERIOD_STARTS[op.get_bind().dialect.name]:
        picked = ", ".join(
            f"FIRST_VALUE({a}) OVER (PARTITION BY {keys}, {start} ORDER BY day {order}) AS {a}"
            for a in attributes
        )
        selects.append(
            f"SELECT '{period}' AS period, {start} AS start, {keys}, {picked}, {counter} FROM {source}"
        )
    maxed = ", ".join(f"MAX({a})" for a in attributes)
    op.execute(
        f"INSERT INTO {table} (period, start, {keys}, {', '.join(attributes)}, {counter}) "
        f"SELECT period, start, {keys}, {maxed}, SUM({counter}) "
        f"FROM ({' UNION ALL '.join(selects)}) AS daily GROUP BY period, start, {keys}"
    )


def upgrade() -> None:
    op.create_table(
        "flow_period_counts",
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("start", sa.Date(), nullable=False),
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("flow_name", sa.String(length=200), nullable=True),
        sa.Column("executions", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("period", "start", "flow_id", name=op.f("pk_flow_period_counts")),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_flow_period_counts_tenant",
        "flow_period_counts",
        ["tenant", "period", "start", "flow_id", "user_id", "flow_name", "executions"],
        unique=False,
    )
    op.create_table(
        "component_period_counts",
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("start", sa.Date(), nullable=False),
        sa.Column("component_id", sa.String(length=200), nullable=False),
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("steps", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "period", "start", "component_id", "flow_id", name=op.f("pk_component_period_counts")
        ),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_component_period_counts_tenant",
        "component_period_counts",
        ["tenant", "period", "start", "component_id", "flow_id", "steps"],
        unique=False,
    )
    # Administrators' edge days: a few days' rows of every flow, from the index alone.
    op.create_index(
        "ix_flow_day_counts_day",
        "flow_day_counts",
        ["day", "flow_id", "tenant", "user_id", "flow_name", "executions"],
        unique=False,
    )
    op.create_index(
        "ix_component_day_counts_day",
        "component_day_counts",
        ["day", "component_id", "flow_id", "steps"],
        unique=False,
    )
    flow_attributes = ("tenant", "user_id", "flow_name")
    _backfill("flow_period_counts", "flow_id", flow_attributes, "executions", latest=True)
    component_attributes = ("tenant", "user_id")
    _backfill("component_period_counts", "component_id, flow_id", component_attributes, "steps", latest=False)


def downgrade() -> None:
    op.drop_index("ix_component_day_counts_day", table_name="component_day_counts")
    op.drop_index("ix_flow_day_counts_day", table_name="flow_day_counts")
    op.drop_index("ix_component_period_counts_tenant", table_name="component_period_counts")
    op.drop_table("component_period_counts")
    op.drop_index("ix_flow_period_counts_tenant", table_name="flow_period_counts")
    op.drop_table("flow_period_counts")
