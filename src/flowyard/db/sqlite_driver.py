"""aiosqlite with one thread hop per statement instead of four.

aiosqlite runs every call on the connection's own thread (SQLite connections
belong to the thread that uses them, and a commit's fsync or a wait for another
process's lock must not block the event loop). SQLAlchemy's adapter makes four
such calls per statement: create a cursor, execute, fetch the rows, close the
cursor; each hop costs more CPU than a small statement itself (a queue put, a
thread wake-up, a ``call_soon_threadsafe`` back). Here the cursor is made on the
spot, and execute, fetch and close happen in one call on the connection's
thread; ``fetchall`` and ``close`` then need no hop (closing a cursor whose rows
were all fetched only frees it, as garbage collection would on this thread
anyway). Everything else is aiosqlite's own. A result is fetched whole with its
statement, so a streamed read (``AsyncConnection.stream``, unused here) would not
stream on SQLite.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable
from typing import Any

import aiosqlite
from aiosqlite.context import contextmanager

_ITER_CHUNK_SIZE = 64


class Cursor(aiosqlite.Cursor):
    """Rows fetched in the same call as the execute."""

    _rows: list[Any] | None = None
    _description: Any = None

    # executemany and executescript are aiosqlite's (one hop each already); they leave no rows.
    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> Cursor:
        self._rows = None
        await super().executemany(sql, parameters)
        self._description = self._cursor.description
        return self

    def _run(self, sql: str, parameters: Any) -> None:
        cur = self._cursor
        cur.execute(sql, parameters)
        self._description = cur.description
        self._rows = cur.fetchall() if self._description is not None else None

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> Cursor:
        await self._execute(self._run, sql, [] if parameters is None else parameters)
        return self

    async def fetchall(self) -> Iterable[sqlite3.Row]:
        rows, self._rows = self._rows, None
        if rows is None:
            return await super().fetchall()
        return rows

    async def fetchone(self) -> sqlite3.Row | None:
        if self._rows is None:
            return await super().fetchone()
        return self._rows.pop(0) if self._rows else None

    async def fetchmany(self, size: int | None = None) -> Iterable[sqlite3.Row]:
        if self._rows is None:
            return await super().fetchmany(size)
        n = size or self._cursor.arraysize
        rows, self._rows = self._rows[:n], self._rows[n:]
        return rows

    async def close(self) -> None:
        self._rows = None
        self._cursor.close()

    @property
    def description(self) -> Any:
        return self._description


class Connection(aiosqlite.Connection):
    @contextmanager
    async def cursor(self) -> Cursor:  # type: ignore[override]
        # Made here, not on the connection's thread: allocating a cursor does not touch the
        # database (the connection is opened with check_same_thread=False).
        return Cursor(self, self._conn.cursor())


def connect(database: str, **kwargs: Any) -> Connection:
    """For SQLAlchemy's aiosqlite dialect (``connect_args={"async_creator_fn": connect}``):
    the same arguments as ``sqlite3.connect``."""
    kwargs["check_same_thread"] = False
    conn = Connection(functools.partial(sqlite3.connect, database, **kwargs), _ITER_CHUNK_SIZE)
    conn._thread.daemon = True  # as SQLAlchemy does for aiosqlite's own connections
    return conn
