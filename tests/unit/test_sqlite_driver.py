"""The one-hop aiosqlite connection (db/sqlite_driver.py) behaves as aiosqlite's own under
SQLAlchemy: rows, several fetch styles, a cursor reused for several statements (the connect
hook does that), executemany, rowcount, errors mapped as before, and it does not block the
event loop while another connection holds SQLite's write lock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

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
