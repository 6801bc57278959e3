"""Migration 0014: on SQLite the columns that hold any JSON value become TEXT, and the numbers
an older flowyard let SQLite keep there (the text ``42`` in a column of NUMERIC affinity became
the integer 42) become JSON text again; every cell then reads back through the models. On
PostgreSQL it changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.logs.models import LogEntry
from flowyard.queue.models import Execution
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

# (stored text, what it reads back as; SQLite had kept 1.0 and 1e5 as the integers 1 and 100000,
# equal to them)
CELLS = [
    ("42", 42),
    ("-0", 0),
    ("1.0", 1.0),
    ("0.5", 0.5),
    ("1e5", 100000.0),
    ("null", None),
    ('"42"', "42"),
    ('{"a": [1, "é"]}', {"a": [1, "é"]}),
]


def _id(i: int) -> str:
    return f"{i:024d}"


def test_legacy_number_cells_become_json_text(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0013")
    sqlite = empty_url.startswith("sqlite")
    created = "'2026-01-02 03:04:05'" if sqlite else "CAST('2026-01-02 03:04:05+00' AS timestamptz)"
    value = ":v" if sqlite else "CAST(CAST(:v AS text) AS json)"

    def insert(conn: sa.Connection) -> None:
        for i, (text, _) in enumerate(CELLS):
            conn.execute(
                sa.text(
                    "INSERT INTO executions (id, flow_id, flow_version, trigger, status, created_at,"
                    " attempts, input, result, steps)"
                    f" VALUES (:id, :f, 1, 'webhook', 'succeeded', {created}, 1, {value}, {value}, {value})"
                ),
                {"id": _id(i), "f": "f" * 24, "v": text},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO logs (id, timestamp, level, message, data)"
                    f" VALUES (:id, {created}, 'info', 'm', {value})"
                ),
                {"id": i + 1, "v": text},
            )
        conn.commit()

    def types(conn: sa.Connection) -> set[str]:
        if not sqlite:
            return set()
        rows = conn.execute(
            sa.text("SELECT typeof(input), typeof(result), typeof(steps) FROM executions")
        ).all()
        logs = conn.execute(sa.text("SELECT typeof(data) FROM logs")).scalars().all()
        return {t for row in rows for t in row} | set(logs)

    _in_sync(empty_url, insert)
    if sqlite:  # the defect being repaired: SQLite kept the numeric texts as numbers
        assert {"integer", "real"} <= _in_sync(empty_url, types)
    migrate.upgrade(empty_url)
    if sqlite:
        assert _in_sync(empty_url, types) == {"text"}

    async def read() -> tuple[list[Any], list[Any]]:
        db = Database(empty_url)
        try:
            async with db.read() as session:
                executions = (
                    await session.execute(
                        sa.select(Execution.id, Execution.input, Execution.result, Execution.steps).order_by(
                            Execution.id
                        )
                    )
                ).all()
                logs = (await session.execute(sa.select(LogEntry.data).order_by(LogEntry.id))).scalars().all()
        finally:
            await db.dispose()
        return [tuple(r) for r in executions], list(logs)

    executions, logs = asyncio.run(read())
    expected = [value for _, value in CELLS]
    assert executions == [(_id(i), v, v, v) for i, v in enumerate(expected)]
    assert logs == expected

    # Down and up again keeps what the cells hold.
    migrate.downgrade(empty_url, "0013")
    migrate.upgrade(empty_url)
    assert asyncio.run(read()) == (executions, logs)
