"""an execution's step results as one JSON document on its row (executions.steps), converted
from the execution_steps rows, which go

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23 23:00:00.000000
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_BATCH = 1000


def _step_columns() -> tuple[sa.Column[Any], ...]:
    return (
        sa.Column("execution_id", sa.String(length=24), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("component_id", sa.String(length=200), nullable=True),
        sa.Column("function", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("messages_in", sa.Integer(), nullable=False),
        sa.Column("messages_out", sa.Integer(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("position", sa.Integer(), nullable=False),
    )


# (column, key in the document) for the plain values; the times are formatted.
_PLAIN = (
    ("node_id", "nodeId"),
    ("component_id", "componentId"),
    ("function", "function"),
    ("status", "status"),
    ("runs", "runs"),
    ("messages_in", "messagesIn"),
    ("messages_out", "messagesOut"),
    ("duration_ms", "durationMs"),
)


def _steps_table() -> sa.TableClause:
    return sa.table("execution_steps", *(sa.column(c.name, c.type) for c in _step_columns()))


def _executions_table() -> sa.TableClause:
    return sa.table("executions", sa.column("id", sa.String(24)), sa.column("steps", sa.JSON()))


def _isoformat(value: datetime) -> str:
    """As the API serves times (flowyard.clock.isoformat, frozen here): UTC, ms, Z."""
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def _parse(text: str, naive: bool) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.replace(tzinfo=None) if naive else value


def upgrade() -> None:
    op.add_column("executions", sa.Column("steps", sa.JSON(), nullable=True))
    bind = op.get_bind()
    steps, executions = _steps_table(), _executions_table()
    last = ""
    while True:  # in batches of executions: memory stays bounded however many steps there are
        ids = list(
            bind.execute(
                sa.select(steps.c.execution_id)
                .where(steps.c.execution_id > last)
                .group_by(steps.c.execution_id)
                .order_by(steps.c.execution_id)
                .limit(_BATCH)
            ).scalars()
        )
        if not ids:
            break
        docs: dict[str, list[dict[str, Any]]] = {eid: [] for eid in ids}
        rows = bind.execute(
            sa.select(steps)
            .where(steps.c.execution_id.in_(ids))
            .order_by(steps.c.execution_id, steps.c.position)
        ).mappings()
        for row in rows:
            docs[row["execution_id"]].append(
                {
                    **{key: row[column] for column, key in _PLAIN},
                    "startedAt": _isoformat(row["started_at"]),
                    "finishedAt": _isoformat(row["finished_at"]),
                    "error": row["error"],
                    "output": row["output"],
                }
            )
        bind.execute(
            sa.update(executions)
            .where(executions.c.id == sa.bindparam("eid"))
            .values(steps=sa.bindparam("doc")),
            [{"eid": eid, "doc": doc} for eid, doc in docs.items()],
        )
        last = ids[-1]
    op.drop_table("execution_steps")


def downgrade() -> None:
    op.create_table(
        "execution_steps",
        *_step_columns(),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["executions.id"],
            name=op.f("fk_execution_steps_execution_id_executions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("execution_id", "node_id", name=op.f("pk_execution_steps")),
    )
    bind = op.get_bind()
    naive = bind.dialect.name == "sqlite"
    steps, executions = _steps_table(), _executions_table()
    last = ""
    while True:
        batch = bind.execute(
            sa.select(executions.c.id, executions.c.steps)
            .where(executions.c.id > last, executions.c.steps.is_not(None))
            .order_by(executions.c.id)
            .limit(_BATCH)
        ).all()
        if not batch:
            break
        rows = [
            {
                "execution_id": eid,
                **{column: step[key] for column, key in _PLAIN},
                "started_at": _parse(step["startedAt"], naive),
                "finished_at": _parse(step["finishedAt"], naive),
                "error": step["error"],
                "output": step["output"],
                "position": position,
            }
            for eid, doc in batch
            for position, step in enumerate(doc or [])
        ]
        if rows:
            bind.execute(sa.insert(steps), rows)
        last = batch[-1][0]
    with op.batch_alter_table("executions") as batch_op:
        batch_op.drop_column("steps")
