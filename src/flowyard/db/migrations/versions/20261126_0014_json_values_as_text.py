"""SQLite: the columns that hold any JSON value (executions.input, .result, .steps, logs.data)
declared TEXT, so SQLite keeps their text as written, and the numbers older versions let it
store there turned back into JSON text; PostgreSQL: nothing to do (json keeps the text)

A column declared JSON has NUMERIC affinity on SQLite: the text ``42`` (a webhook body), ``1.0``
or ``-0`` became a number, which the JSON reader could not read (issue 15). Rebuilding the
tables with TEXT columns converts those numbers to their text on the copy (TEXT affinity), which
is valid JSON. Text that is not JSON is not touched: ``flowyard check`` reports it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 10:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

COLUMNS = {"executions": ("input", "result", "steps"), "logs": ("data",)}


def _retype(to_text: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    old, new = (sa.JSON(), sa.Text()) if to_text else (sa.Text(), sa.JSON())
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table, recreate="always") as batch:
            for column in columns:
                batch.alter_column(column, type_=new, existing_type=old, existing_nullable=True)
        if to_text:
            for column in columns:  # the copy converted them already; this says so
                op.execute(
                    sa.text(
                        f"UPDATE {table} SET {column} = CAST({column} AS TEXT)"
                        f" WHERE typeof({column}) IN ('integer', 'real')"
                    )
                )


def upgrade() -> None:
    _retype(True)


def downgrade() -> None:
    _retype(False)
