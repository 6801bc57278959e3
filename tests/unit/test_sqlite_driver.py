"""The one-hop aiosqlite connection (db/sqlite_driver.py) behaves as aiosqlite's own under
SQLAlchemy: rows, several fetch styles, a cursor reused for several statements (the connect
hook does that), executemany, rowcount, errors mapped as before, and it does not block the
event loop while another connection holds SQLite's write lock."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.db import sqlite_driver
from flowyard.db.session import Database
from flowyard.errors import Conflict


@pytest.fixture
async def database(tmp_path: Path) -> Database:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'd.sqlite'}")
    async with db.write() as s:
        await s.execute(sa.text("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"))
    return db


async def test_statements_rows_and_errors(database: Database) -> None:
    db = database
    async with db.engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert isinstance(raw, sqlite_driver.Connection)
        # The connect hook ran its PRAGMAs on one cursor.
        assert (await conn.exec_driver_sql("PRAGMA synchronous")).scalar() == 2  # FULL
    async with db.write() as s:
        result = await s.execute(
            sa.text("INSERT INTO t (k, v) VALUES (:k, :v)"), [{"k": i, "v": f"v{i}"} for i in range(5)]
        )
        assert result.rowcount == 5
        updated = await s.execute(sa.text("UPDATE t SET v = v || '!' WHERE k < 3"))
        assert updated.rowcount == 3
    async with db.read() as s:
        assert (await s.execute(sa.text("SELECT k, v FROM t ORDER BY k"))).all() == [
            (0, "v0!"), (1, "v1!"), (2, "v2!"), (3, "v3"), (4, "v4")
        ]  # fmt: skip
        assert (await s.execute(sa.text("SELECT v FROM t WHERE k = 4"))).scalar_one() == "v4"
        assert (await s.execute(sa.text("SELECT v FROM t WHERE k = 9"))).first() is None
        assert [r.k for r in (await s.execute(sa.text("SELECT k FROM t ORDER BY k"))).fetchmany(2)] == [0, 1]
    with pytest.raises(Conflict):
        async with db.write() as s:
            await s.execute(sa.text("INSERT INTO t (k, v) VALUES (1, 'again')"))
    async with db.write() as s:  # the failed transaction left nothing behind
        returned = await s.execute(sa.text("DELETE FROM t WHERE k >= 3 RETURNING k"))
        assert sorted(returned.scalars().all()) == [3, 4]
    async with db.read() as s:
        assert (await s.execute(sa.text("SELECT count(*) FROM t"))).scalar() == 3
    await db.dispose()


async def test_a_held_write_lock_does_not_block_the_loop(database: Database) -> None:
    """Statements still run on the connection's own thread: while another connection holds
    the write lock, a waiting writer leaves the event loop free."""
    db = database
    other = Database(db.url.render_as_string(hide_password=False))
    other._file_lock = None  # test SQLite's own lock, not the advisory file lock beside it
    db._file_lock = None

    async def write() -> None:
        async with db.write() as s:
            await s.execute(sa.text("INSERT INTO t (k, v) VALUES (101, 'waited')"))

    async with other.write() as holder:
        await holder.execute(sa.text("INSERT INTO t (k, v) VALUES (100, 'held')"))
        writer = asyncio.create_task(write())
        ticks = 0
        while ticks < 20:  # the loop keeps turning while the writer waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert not writer.done()
    await asyncio.wait_for(writer, 30)
    async with db.read() as s:
        assert (await s.execute(sa.text("SELECT v FROM t WHERE k >= 100 ORDER BY k"))).scalars().all() == [
            "held",
            "waited",
        ]
    await other.dispose()
    await db.dispose()


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")


async def _rows(db: Database) -> list[tuple[int, str]]:
    async with db.read() as s:
        return [tuple(r) for r in (await s.execute(sa.text("SELECT k, v FROM t ORDER BY k"))).all()]


async def test_transact_runs_the_whole_transaction_on_the_database_thread(database: Database) -> None:
    """``Database.transact`` on a SQLite file: every statement of the transaction on one
    thread that is not the event loop's, committed when the function returns."""
    db = database
    loop_thread = threading.get_ident()
    seen: list[int] = []

    async def insert(session: AsyncSession) -> int:
        assert _REQUEST.get() == "the caller's"  # the caller's context (log lines keep their fields)
        seen.append(threading.get_ident())
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (1, 'one')"))
        seen.append(threading.get_ident())
        synchronous = (await session.execute(sa.text("PRAGMA synchronous"))).scalar()
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (2, 'two')"))
        seen.append(threading.get_ident())
        return int(synchronous)

    _REQUEST.set("the caller's")
    assert await db.transact(insert) == 2  # FULL: durable by default
    assert len(set(seen)) == 1 and seen[0] != loop_thread
    assert await _rows(db) == [(1, "one"), (2, "two")]

    async def relaxed(session: AsyncSession) -> int:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (3, 'three')"))
        return int((await session.execute(sa.text("PRAGMA synchronous"))).scalar())

    assert await db.transact(relaxed, durable=False) == 1  # NORMAL: a repeatable write
    assert await db.transact(_select_count) == 3
    await db.dispose()


async def _select_count(session: AsyncSession) -> int:
    return int((await session.execute(sa.text("SELECT count(*) FROM t"))).scalar())


async def test_transact_rolls_back_what_fails_and_refuses_what_waits(database: Database) -> None:
    db = database

    async def duplicate(session: AsyncSession) -> None:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (7, 'first')"))
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (7, 'again')"))

    with pytest.raises(Conflict):  # mapped as write() maps it
        await db.transact(duplicate)

    async def raises(session: AsyncSession) -> None:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (8, 'lost')"))
        raise ValueError("the caller's own error")

    with pytest.raises(ValueError, match="the caller's own error"):
        await db.transact(raises)

    async def waits(session: AsyncSession) -> None:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (9, 'lost')"))
        await asyncio.sleep(0)  # would need the event loop: not allowed on the database's thread

    with pytest.raises(RuntimeError, match="awaited something that waits"):
        await db.transact(waits)
    assert await _rows(db) == []  # nothing of the three was kept

    async def fine(session: AsyncSession) -> None:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (10, 'kept')"))

    await db.transact(fine)  # the connection is usable after each of them
    assert await _rows(db) == [(10, "kept")]
    await db.dispose()


async def test_a_cancelled_transact_ends_its_transaction_before_letting_go(database: Database) -> None:
    """Cancelling the caller does not leave the transaction running behind the process's
    write lock: the caller returns only once it ended, and the next writer runs after."""
    db = database
    inside, go_on = threading.Event(), threading.Event()

    async def slow(session: AsyncSession) -> None:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (1, 'slow')"))
        inside.set()
        go_on.wait(10)  # a blocking wait, on the database's thread

    task = asyncio.create_task(db.transact(slow))
    await asyncio.to_thread(inside.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for its transaction to end
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def after(session: AsyncSession) -> None:
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (2, 'after')"))

    await asyncio.wait_for(db.transact(after), 10)
    assert await _rows(db) == [(1, "slow"), (2, "after")]  # the cancelled one had committed
    await db.dispose()


async def test_transact_without_the_direct_thread_is_a_write(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'd.sqlite'}", direct=False)
    loop_thread = threading.get_ident()
    seen: list[int] = []

    async def create(session: AsyncSession) -> None:
        seen.append(threading.get_ident())
        await session.execute(sa.text("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"))
        await session.execute(sa.text("INSERT INTO t (k, v) VALUES (1, 'x')"))

    await db.transact(create)
    assert seen == [loop_thread]
    assert await _rows(db) == [(1, "x")]
    await db.dispose()
