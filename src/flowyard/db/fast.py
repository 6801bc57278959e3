"""Hot-path reads without an ORM session: a Core ``SELECT`` compiled once per dialect, run
straight on the driver.

On SQLite every statement through SQLAlchemy's session on aiosqlite pays several thread hops
(cursor, execute, fetch, close) and the ORM's bookkeeping: ~1.5 ms of CPU for a one-row read,
where running the same compiled SQL and fetching its rows in one hop of the connection's
thread (``aiosqlite.Connection.execute_fetchall``) costs ~0.45 ms (pool checkout included;
measured on the 2-core machine, see docs/performance.md "Flow API"). The values are converted
by the columns' own SQLAlchemy types (JSON, ``UTCDateTime``), so a row reads the same as it
would through the ORM. On PostgreSQL (asyncpg, no thread hops) the statement runs through a
Core connection, with SQLAlchemy's compiled cache.

Only for reads that need no transaction beyond one statement; writes go through
``Database.write()``.
"""

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
    ``db/prepared.py``'s compiler, the one that converts values as the columns' types do)."""

    def __init__(self, statement: sa.Select[Any]) -> None:
        self.statement = statement
        self.names = [str(c.key) for c in statement.selected_columns]
        self._sqlite: SQLiteForm | None = None

    async def all(self, db: Database, **params: Any) -> list[Row]:
        prepared = None
        if db.is_sqlite:
            if self._sqlite is None:
                self._sqlite = SQLiteForm(self.statement, db.engine.dialect, None)
            prepared = self._sqlite.args(params)
        if prepared is None:  # PostgreSQL (or an empty IN list): a Core connection
            async with db.engine.connect() as conn:
                try:
                    result = await conn.execute(self.statement, params)
                except DBAPIError as exc:
                    raise map_db_error(exc) from exc
                return [Row(dict(zip(self.names, r, strict=True))) for r in result]
        sql, args = prepared
        async with db.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            try:
                rows = await driver.execute_fetchall(sql, args)
            except sqlite3.Error as exc:  # as the session path maps them (busy: 503)
                wrapped = DBAPIError.instance(sql, args, exc, sqlite3.Error)
                assert isinstance(wrapped, DBAPIError)
                raise map_db_error(wrapped) from exc
        assert self._sqlite is not None
        names = self.names
        return [Row(dict(zip(names, row, strict=True))) for row in self._sqlite.rows(list(rows))]

    async def first(self, db: Database, **params: Any) -> Row | None:
        rows = await self.all(db, **params)
        return rows[0] if rows else None
