"""Prepared statements (db/prepared.py) read and write exactly as the session does: on a direct
SQLite transaction on the ``sqlite3`` cursor (proved below: SQLAlchemy executes none of them),
elsewhere through the session (PostgreSQL, a SQLite ``write()``). Typed values both ways (JSON,
time stamps as UTC, dates), expanding lists (empty too), rowcounts, a unique violation and an
unencodable value among good rows: the transaction fails whole and stores nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, date, datetime
from typing import Any, TypeVar, cast

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.db.prepared import Prepared
from flowyard.db.session import Database
from flowyard.errors import Conflict, StorageUnavailable
from flowyard.flows.models import Flow
from flowyard.logs.models import LogEntry
from flowyard.queue.models import FlowDayCount

T = TypeVar("T")
LOGS = cast(sa.Table, LogEntry.__table__)
DAYS = cast(sa.Table, FlowDayCount.__table__)
COLUMNS = ("timestamp", "level", "message", "tenant", "user_id", "flow_id", "execution_id", "data")
INSERT = Prepared(sa.insert(LOGS), columns=COLUMNS)
SELECT = Prepared(
    sa.select(LOGS.c.message, LOGS.c.timestamp, LOGS.c.data)
    .where(
        LOGS.c.tenant == sa.bindparam("tenant"), LOGS.c.message.in_(sa.bindparam("messages", expanding=True))
    )
    .order_by(LOGS.c.message)
)
RENAME = Prepared(
    sa.update(LOGS).where(LOGS.c.tenant == sa.bindparam("who")).values(level=sa.bindparam("to"))
)
COUNT_DAY = Prepared(
    sa.insert(DAYS), columns=("day", "flow_id", "tenant", "user_id", "flow_name", "executions")
)
READ_DAY = Prepared(sa.select(DAYS.c.day, DAYS.c.executions).where(DAYS.c.tenant == sa.bindparam("tenant")))


def entry(message: str, data: Any, tenant: str = "tp") -> dict[str, Any]:
    return {
        "timestamp": datetime(2026, 12, 6, 21, 0, 1, 250000, tzinfo=UTC),
        "level": "info",
        "message": message,
        "tenant": tenant,
        "user_id": "u1",
        "flow_id": "f1",
        "execution_id": None,
        "data": data,
    }


def paths(db: Database) -> list[Callable[[Callable[[AsyncSession], Awaitable[T]]], Awaitable[T]]]:
    """Each way a transaction runs on this database: ``transact`` (direct on a SQLite file) and
    ``write()``."""

    async def via_write(fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        async with db.write() as session:
            return await fn(session)

    return [db.transact, via_write]


async def test_values_round_trip_as_through_the_session(db: Database) -> None:
    data = {"n": 1, "nested": {"list": [1, 2.5, None, "é"]}, "big": 2**60}
    for n, run in enumerate(paths(db)):
        tenant = f"tp{n}"

        async def write(s: AsyncSession, tenant: str = tenant) -> int:
            await INSERT.many(
                s, [entry("a", data, tenant), entry("b", None, tenant), entry("c", [1], tenant)]
            )
            await COUNT_DAY.many(
                s,
                [{"day": date(2026, 12, 6), "flow_id": tenant, "tenant": tenant, "user_id": None,
                  "flow_name": "x", "executions": 3}],
            )  # fmt: skip
            return await RENAME.run(s, {"who": tenant, "to": "warn"})

        assert await run(write) == 3

        async def read(s: AsyncSession, tenant: str = tenant) -> tuple[Any, Any, Any, Any]:
            return (
                await SELECT.all(s, {"tenant": tenant, "messages": ["a", "b", "zz"]}),
                await SELECT.all(s, {"tenant": tenant, "messages": []}),
                await READ_DAY.all(s, {"tenant": tenant}),
                await RENAME.run(s, {"who": "nobody", "to": "x"}),
            )

        rows, none, days, changed = await run(read)
        stamp = datetime(2026, 12, 6, 21, 0, 1, 250000, tzinfo=UTC)
        assert rows == [("a", stamp, data), ("b", stamp, None)]
        assert rows[0][1].tzinfo is not None
        assert none == []
        assert days == [(date(2026, 12, 6), 3)]
        assert changed == 0
        # What the ORM reads of the same rows is the same.
        async with db.read() as s:
            orm = (
                await s.scalars(
                    sa.select(LogEntry).where(LogEntry.tenant == tenant).order_by(LogEntry.message)
                )
            ).all()
        assert [(e.message, e.level, e.timestamp, e.data) for e in orm] == [
            ("a", "warn", stamp, data), ("b", "warn", stamp, None), ("c", "warn", stamp, [1])
        ]  # fmt: skip


@pytest.fixture
async def sqlite_db(sqlite_url: str) -> AsyncIterator[Database]:
    """A SQLite file's database (PostgreSQL runs every statement through the session)."""
    database = Database(sqlite_url)
    assert database._direct is not None
    try:
        yield database
    finally:
        await database.dispose()


async def test_direct_transactions_run_them_on_the_cursor(sqlite_db: Database) -> None:
    db = sqlite_db
    assert db._direct is not None
    seen: list[str] = []
    sa.event.listen(db._direct.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))

    async def write(s: AsyncSession) -> list[Any]:
        await INSERT.many(s, [entry("d", 1, "direct")])
        return await SELECT.all(s, {"tenant": "direct", "messages": ["d"]})

    assert [r[0] for r in await db.transact(write)] == ["d"]
    assert seen == ["BEGIN IMMEDIATE"]  # only the session's own BEGIN: the statements ran raw


async def test_a_failure_rolls_back_the_whole_transaction(db: Database) -> None:
    for n, run in enumerate(paths(db)):
        tenant = f"tf{n}"

        async def duplicate(s: AsyncSession, tenant: str = tenant) -> None:
            await INSERT.many(s, [entry("kept?", 1, tenant)])
            row = {"day": date(2026, 1, 1), "flow_id": "f", "tenant": tenant, "user_id": None,
                   "flow_name": "x", "executions": 1}  # fmt: skip
            await COUNT_DAY.many(s, [row, row])

        with pytest.raises(Conflict):
            await run(duplicate)

        async def poison(s: AsyncSession, tenant: str = tenant) -> None:
            await INSERT.many(s, [entry("good", 1, tenant), entry("bad", {"x": object()}, tenant)])

        with pytest.raises(Exception) as caught:
            await run(poison)
        assert "object" in str(caught.value) or "serializable" in str(caught.value)
        async with db.read() as s:
            assert (await s.scalar(sa.select(sa.func.count()).where(LOGS.c.tenant == tenant))) == 0
            assert (await s.scalar(sa.select(sa.func.count()).where(DAYS.c.tenant == tenant))) == 0


async def test_a_python_side_default_is_refused_not_skipped(sqlite_db: Database) -> None:
    """A column whose default SQLAlchemy computes in Python (``flows.id``) cannot be left out:
    the cursor path would store NULL where the session path makes an id."""
    db = sqlite_db
    flows = cast(sa.Table, Flow.__table__)
    bad = Prepared(sa.insert(flows), columns=("name",))

    async def write(s: AsyncSession) -> None:
        await bad.many(s, [{"name": "x"}])

    with pytest.raises(NotImplementedError):
        await db.transact(write)


async def test_lists_built_into_a_statement_and_refused_shapes(sqlite_db: Database) -> None:
    """An ``IN`` list written into the statement is taken as written (beside a list given at
    each run); a tuple ``IN`` and a computed parameter are refused when compiled."""
    db = sqlite_db
    both = Prepared(
        sa.select(LOGS.c.message)
        .where(
            LOGS.c.level.in_(["info", "warn"]),
            LOGS.c.message.in_(sa.bindparam("messages", expanding=True)),
            LOGS.c.tenant == sa.bindparam("tenant"),
        )
        .order_by(LOGS.c.message)
    )

    async def run(s: AsyncSession) -> list[Any]:
        await INSERT.many(
            s, [entry("x", 1, "built"), entry("y", 1, "built"), {**entry("z", 1, "built"), "level": "error"}]
        )
        return await both.all(s, {"messages": ["x", "z", "y"], "tenant": "built"})

    assert await db.transact(run) == [("x",), ("y",)]
    for refused in (
        Prepared(
            sa.select(LOGS.c.id).where(
                sa.tuple_(LOGS.c.level, LOGS.c.message).in_(sa.bindparam("t", expanding=True))
            )
        ),
        Prepared(sa.select(LOGS.c.id).where(LOGS.c.message == sa.bindparam("m", callable_=lambda: "now"))),
    ):

        async def attempt(s: AsyncSession, p: Prepared = refused) -> list[Any]:
            return await p.all(s, {"t": [("a", "b")]})

        with pytest.raises(NotImplementedError):
            await db.transact(attempt)


async def test_a_lost_connection_is_transient_and_replaced(sqlite_db: Database) -> None:
    """The driver's connection gone under a direct transaction: the statement's error is the
    storage's (503, retried, never an item's poison), and the next transaction reconnects."""
    db = sqlite_db

    async def lose(s: AsyncSession) -> list[Any]:
        cast(Any, s).driver().close()
        return await SELECT.all(s, {"tenant": "gone", "messages": ["a"]})

    with pytest.raises(StorageUnavailable):
        await db.transact(lose)

    async def again(s: AsyncSession) -> list[Any]:
        return await SELECT.all(s, {"tenant": "gone", "messages": ["a"]})

    assert await db.transact(again) == []
