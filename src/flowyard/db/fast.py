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

from flowyard.db.session import Database, map_db_error

_Compiled = tuple[str, list[str], list[Any], list[Any]]


class Row:
    """One result row: values by column name, as attributes."""

    __slots__ = ("__dict__",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


class Fetch:
    """A Core ``SELECT`` with named bind parameters, compiled once per dialect."""

    def __init__(self, statement: sa.Select[Any]) -> None:
        self.statement = statement
        self.names = [str(c.key) for c in statement.selected_columns]
        self._sqlite: _Compiled | None = None

    def _compiled_for_sqlite(self, dialect: sa.Dialect) -> _Compiled:
        if self._sqlite is None:
            compiled = self.statement.compile(dialect=dialect)
            order = list(compiled.positiontup or [])
            binds = [
                compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect) for name in order
            ]
            results = [
                c.type.dialect_impl(dialect).result_processor(dialect, None)
                for c in self.statement.selected_columns
            ]
            self._sqlite = (compiled.string, order, binds, results)
        return self._sqlite

    async def all(self, db: Database, **params: Any) -> list[Row]:
        if not db.is_sqlite:
            async with db.engine.connect() as conn:
                try:
                    result = await conn.execute(self.statement, params)
                except DBAPIError as exc:
                    raise map_db_error(exc) from exc
                return [Row(dict(zip(self.names, r, strict=True))) for r in result]
        sql, order, binds, results = self._compiled_for_sqlite(db.engine.dialect)
        args = [p(params[n]) if p else params[n] for n, p in zip(order, binds, strict=True)]
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
        names = self.names
        return [
            Row({n: (p(v) if p else v) for n, p, v in zip(names, results, row, strict=True)}) for row in rows
        ]

    async def first(self, db: Database, **params: Any) -> Row | None:
        rows = await self.all(db, **params)
        return rows[0] if rows else None
