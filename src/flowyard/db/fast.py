"""Reads without an ORM session: a Core ``SELECT`` compiled once per dialect, run straight on
the driver.

On SQLite every statement through SQLAlchemy's session on aiosqlite pays several thread hops
(cursor, execute, fetch, close) and the ORM's bookkeeping: ~1.5 ms of CPU for a one-row read.
Here the compiled SQL runs on the ``sqlite3`` connection itself (``Database.driver_rows``): a
point read (a flow by id, a token, the flow counts) on the calling thread, with no hop at all
(~0.02 ms for a flow by id, against ~0.29 ms in one hop of a pooled connection's thread);
a longer read in one hop. The values are converted by the columns' own SQLAlchemy types (JSON,
``UTCDateTime``), so a row reads the same as it would through the ORM (docs/performance.md,
"Flow API"). On PostgreSQL (asyncpg, no thread hops) the statement runs through a Core
connection, with SQLAlchemy's compiled cache.

Only for reads that need no transaction beyond one statement; writes go through
``Database.write()``."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from flowyard.db.prepared import SQLiteForm
from flowyard.db.session import Database, map_db_error


class Row:
    """One result row: values by column name, as attributes."""

    __slots__ = ("__dict__",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


class Fetch:
    """A Core ``SELECT`` with named bind parameters, compiled once per dialect (on SQLite by
    ``db/prepared.py``'s compiler, the one that converts values as the columns' types do).

    ``all`` is for point reads (a few index lookups, never a scan): on a SQLite file they run
    on the calling thread (``Database.driver_rows``), where a long statement would hold the
    event loop; ``rows(..., inline=False)`` runs any other read in one hop of a pooled
    connection's thread."""

    def __init__(self, statement: sa.Select[*tuple[Any, ...]]) -> None:
        self.statement = statement
        self.names = [str(c.key) for c in statement.selected_columns]
        self._sqlite: SQLiteForm | None = None

    async def all(self, db: Database, **params: Any) -> list[Row]:
        """The rows of a point read (on a SQLite file, on the calling thread)."""
        return await self.rows(db, params)

    async def rows(self, db: Database, params: Mapping[str, Any], *, inline: bool = True) -> list[Row]:
        """The statement's rows for ``params``. ``inline=False`` for a statement that may read
        more than a few index entries (a page deep into a list): on SQLite it then runs on a
        pooled connection's thread, in one hop, and the event loop goes on meanwhile."""
        prepared = None
        if db.is_sqlite:
            if self._sqlite is None:
                self._sqlite = SQLiteForm(self.statement, db.engine.dialect, None)
            prepared = self._sqlite.args(params)
        if prepared is None:  # PostgreSQL (or an empty IN list): a Core connection
            try:
                return await self._core(db, params)
            except DBAPIError as exc:
                if not exc.connection_invalidated:
                    raise map_db_error(exc) from exc
            try:  # a pooled connection the server had closed (session._ping_when_idle): again
                return await self._core(db, params)
            except DBAPIError as exc:
                raise map_db_error(exc) from exc
        sql, args = prepared
        try:
            rows = await db.driver_rows(sql, args, inline=inline)
        except sqlite3.Error as exc:  # as the session path maps them (busy: 503)
            wrapped = DBAPIError.instance(sql, args, exc, sqlite3.Error)
            assert isinstance(wrapped, DBAPIError)
            raise map_db_error(wrapped) from exc
        assert self._sqlite is not None
        names = self.names
        return [Row(dict(zip(names, row, strict=True))) for row in self._sqlite.rows(rows)]

    async def _core(self, db: Database, params: Mapping[str, Any]) -> list[Row]:
        async with db.engine.connect() as conn:
            if not db.is_sqlite:
                # One statement needs no transaction of its own: no BEGIN and ROLLBACK
                # round trips around it (asyncpg starts none in autocommit).
                await conn.execution_options(isolation_level="AUTOCOMMIT")
            result = await conn.execute(self.statement, dict(params))
            return [Row(dict(zip(self.names, r, strict=True))) for r in result]

    async def first(self, db: Database, **params: Any) -> Row | None:
        rows = await self.all(db, **params)
        return rows[0] if rows else None
