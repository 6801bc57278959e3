"""Point reads on the event loop's own thread (``Database.driver_rows(inline=True)``, used by
``fast.Fetch``: a flow by id, a token, the flow counts, a list page near the start): they see
every commit at once, whichever connection or process made it; they never make the loop wait
for SQLite (where a reader would have to wait, the read goes through the pool instead, and
the loop goes on); they write nothing; and their rows are the ORM's."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from flowyard.api.listing import ListQuery
from flowyard.components.registry import Registry
from flowyard.db.fast import Fetch
from flowyard.db.session import Database
from flowyard.flows import service as flows
from flowyard.flows.models import Flow
from flowyard.iam.principal import Principal
from tests.conftest import flow_body


@pytest.fixture
async def database(tmp_path: Path) -> Database:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'd.sqlite'}")
    async with db.write() as s:
        await s.execute(sa.text("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"))
        await s.execute(sa.text("INSERT INTO t (k, v) VALUES (1, 'one')"))
    return db


T = sa.table("t", sa.column("k", sa.Integer), sa.column("v", sa.String))
READ = Fetch(sa.select(T.c.k, T.c.v).where(T.c.k == sa.bindparam("k")))


async def _value(db: Database, k: int) -> str | None:
    row = await READ.first(db, k=k)
    return None if row is None else str(row.v)


async def test_sees_every_commit_at_once_and_writes_nothing(database: Database, tmp_path: Path) -> None:
    db = database
    assert await _value(db, 1) == "one"
    # A commit by another connection (as another process would make it) is read at once: each
    # inline read is its own read transaction, no snapshot is kept between two reads.
    other = sqlite3.connect(tmp_path / "d.sqlite", isolation_level=None)
    other.execute("UPDATE t SET v = 'uno' WHERE k = 1")
    assert await _value(db, 1) == "uno"
    # An uncommitted change is not seen, and the read does not wait for the writer (WAL).
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE t SET v = 'eins' WHERE k = 1")
    assert await _value(db, 1) == "uno"
    other.execute("COMMIT")
    assert await _value(db, 1) == "eins"
    other.close()
    # The loop thread's connection is read-only: a write through it is refused by SQLite.
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        await db.driver_rows("UPDATE t SET v = 'x' RETURNING k", [], inline=True)
    await db.dispose()


async def test_a_read_sqlite_would_make_wait_goes_through_the_pool(tmp_path: Path) -> None:
    """A connection holding the file in exclusive locking mode makes every other reader wait.
    The inline read does not wait on the loop's thread: it is handed to a pooled connection
    (busy_timeout 30 s, on its own thread), the loop goes on meanwhile, and the read is
    answered once the lock is let go."""
    path = tmp_path / "held.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t (k, v) VALUES (1, 'held')")
    holder.execute("COMMIT")  # exclusive mode keeps the lock after the commit
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        sqlite3.connect(path, timeout=0).execute("SELECT v FROM t").fetchall()

    db = Database(f"sqlite+aiosqlite:///{path}")
    read = asyncio.create_task(_value(db, 1))
    loop = asyncio.get_running_loop()
    stalled = 0.0
    for _ in range(20):  # the loop keeps running while the read waits for the lock
        before = loop.time()
        await asyncio.sleep(0.01)
        stalled = max(stalled, loop.time() - before)
    assert not read.done()
    # Not a timing bound: a read waiting on the loop's thread would hold it for SQLite's whole
    # busy timeout (seconds); here no tick of the loop waits for the read at all.
    assert stalled < 1.0
    holder.close()  # lets the lock go
    assert await asyncio.wait_for(read, 10) == "held"
    assert await _value(db, 1) == "held"  # and inline again
    await db.dispose()


async def test_rows_are_the_orms(db: Database, registry: Registry) -> None:
    """Through Fetch (inline on SQLite, a Core connection on PostgreSQL) a flow reads as the ORM
    reads it (JSON documents, UTC datetimes), alone and in a list page near the start (inline)
    or deep (a pooled connection's thread)."""
    admin = Principal("a" * 24, "admin@example.com", None, frozenset({"all"}), "")
    made = [
        flows.prepare_new_flow(admin, flow_body(f"flow {i}", description="ü ☃ snow"), registry)
        for i in range(30)
    ]
    async with db.write() as session:
        await flows.insert_flows(session, made)
    async with db.read() as session:
        expected = [
            flows.to_dict(f) for f in (await session.scalars(sa.select(Flow).order_by(Flow.id))).all()
        ]
    for flow in expected:
        row = await flows._READ_ONE.first(db, flow_id=flow["id"])
        assert row is not None
        assert flows.to_dict(row) == flow
    assert await flows._READ_ONE.first(db, flow_id="0" * 24) is None
    seen: list[dict[str, object]] = []
    for number in range(1, 5):
        page, total, _exact = await flows.list_flows(db, admin, ListQuery(page=number, size=9))
        assert total == 30
        seen += [flows.to_dict(f) for f in page]
    assert seen == expected
    saved = flows.INLINE_PAGE_ROWS
    flows.INLINE_PAGE_ROWS = 0  # every page through the pool
    try:
        page, _, _ = await flows.list_flows(db, admin, ListQuery(page=2, size=9))
    finally:
        flows.INLINE_PAGE_ROWS = saved
    assert [flows.to_dict(f) for f in page] == expected[9:18]
