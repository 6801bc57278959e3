"""The hot transactions' statements, built once and, on SQLite, compiled once and run on the
``sqlite3`` cursor.

A webhook execution costs three write transactions (accept a batch, claim, record the
outcomes) of about fifteen statements between them. Through SQLAlchemy's session each
statement costs ~100 to 130 µs of CPU (building the statement, its cache key, the execution
context, parameter and result processing) where SQLite itself needs ~10 µs
(docs/performance.md). A ``Prepared`` is a Core statement with named bind parameters, built
once (per dialect where the SQL differs); the transaction's code runs it with
:meth:`Prepared.all`, :meth:`Prepared.run` or :meth:`Prepared.many`:

- in a direct SQLite transaction (``Database.transact``, a ``SessionBridge``) its SQL,
  compiled once, runs straight on the connection's ``sqlite3`` cursor, the values converted
  by the columns' own SQLAlchemy types (JSON, ``UTCDateTime``) both ways, so a row reads and
  writes exactly as through the session;
- anywhere else (PostgreSQL, a SQLite ``write()``) it is ``session.execute`` of the prebuilt
  statement, whose cache key SQLAlchemy then computes once.

So the transaction's logic is written once for both databases. A driver error is raised as
SQLAlchemy's ``DBAPIError`` either way (``map_db_error``, ``isolate.is_transient`` read it).
An ``IN`` takes an expanding parameter (``sa.bindparam(name, expanding=True)``); an empty list
runs through the session, which knows how to say "in nothing".
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.db.session import SessionBridge

_Processor = Callable[[Any], Any] | None
T = TypeVar("T")
# The SQL texts kept per statement, one per combination of its IN lists' lengths.
_SIZED = 256


class SQLiteForm:
    """A statement's SQLite form, compiled once: its SQL, bind order and the converters of its
    values (the columns' own SQLAlchemy types) both ways. Used by ``Prepared`` and ``fast.Fetch``."""

    __slots__ = ("binds", "defaults", "expanding", "names", "results", "sized", "sql")

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect, columns: Sequence[str] | None) -> None:
        compiled = cast(Any, statement).compile(dialect=dialect, column_keys=columns)
        if compiled.insert_prefetch or compiled.update_prefetch:
            # A column default computed in Python: SQLAlchemy's execution context makes it.
            raise NotImplementedError("a prepared statement must be given every column with a default")
        self.names: list[str] = list(compiled.positiontup or [])
        self.binds: list[_Processor] = []
        self.expanding: set[str] = set()
        self.defaults: dict[str, Any] = {}
        for name in self.names:
            bind = compiled.binds[name]
            if bind.callable is not None:  # its value is computed at each execution
                raise NotImplementedError(
                    f"a bind parameter with a callable ({name}) in a prepared statement"
                )
            if bind.expanding:
                if bind.type._is_tuple_type:
                    raise NotImplementedError(f"a tuple IN ({name}) in a prepared statement")
                self.expanding.add(name)
            if not bind.required:  # a value built into the statement (an IN list too)
                self.defaults[name] = bind.effective_value
            # An expanding parameter's type is its elements' (SQLAlchemy converts each with it).
            self.binds.append(bind.type._cached_bind_processor(dialect))
        sql: str = compiled.string
        for name in self.names:
            if name not in self.expanding and f"__[POSTCOMPILE_{name}]" in sql:
                raise NotImplementedError(f"a literal-execute parameter ({name}) in a prepared statement")
        self.sql = sql
        self.results: list[_Processor] = [
            entry.type._cached_result_processor(dialect, None) for entry in compiled._result_columns
        ]
        # The SQL for each combination of list lengths of the expanding parameters.
        self.sized: dict[tuple[int, ...], str] = {}

    def args(self, params: Mapping[str, Any]) -> tuple[str, list[Any]] | None:
        """The SQL and its positional values for ``params``; None: an empty expanding list."""
        values: list[Any] = []
        sizes: list[int] = []
        defaults = self.defaults
        for name, process in zip(self.names, self.binds, strict=True):
            value = params[name] if name in params or name not in defaults else defaults[name]
            if name in self.expanding:
                items = list(value)
                if not items:
                    return None
                sizes.append(len(items))
                values += [process(v) for v in items] if process else items
            else:
                values.append(process(value) if process else value)
        if not sizes:
            return self.sql, values
        key = tuple(sizes)
        sql = self.sized.get(key)
        if sql is None:
            sql = self.sql
            for name, n in zip((n for n in self.names if n in self.expanding), sizes, strict=True):
                sql = sql.replace(f"__[POSTCOMPILE_{name}]", ", ".join("?" * n), 1)
            if len(self.sized) >= _SIZED:  # bounded: the combinations of lengths are many
                self.sized.clear()
            self.sized[key] = sql
        return sql, values

    def rows(self, raw: list[Any]) -> list[tuple[Any, ...]]:
        results = self.results
        if not any(results):
            return [tuple(r) for r in raw]
        return [tuple(p(v) if p else v for p, v in zip(results, row, strict=True)) for row in raw]


def _error(bridge: SessionBridge, sql: str, args: Any, exc: sqlite3.Error) -> DBAPIError:
    """The driver's error as the session would raise it: SQLAlchemy's ``DBAPIError`` (so
    ``map_db_error`` and ``isolate`` read it the same), a lost connection flagged and the
    connection let go, so the next transaction opens a new one."""
    connection = bridge.sync_session.connection()
    lost = connection.dialect.is_disconnect(cast(Any, exc), connection.connection.dbapi_connection, None)
    wrapped = DBAPIError.instance(sql, args, exc, sqlite3.Error, connection_invalidated=lost)
    assert isinstance(wrapped, DBAPIError)
    if lost:
        connection.invalidate(exc)
    return wrapped


@functools.cache
def insert_into(table: sa.Table, columns: tuple[str, ...]) -> Prepared:
    """The one ``Prepared`` insert of rows giving ``columns`` into ``table`` (an executemany
    needs the same columns in every row: callers pass the first row's)."""
    return Prepared(sa.insert(table), columns=columns)


class Prepared:
    """A Core statement with named bind parameters, built once (``build`` may be the statement
    or a function of the dialect's name, for SQL that differs) and run by the hot transactions.

    ``columns``: for an ``INSERT`` without ``.values()``, the columns its rows give, each
    bound by its own name (as an executemany through the session binds them)."""

    __slots__ = ("_build", "_sqlite", "_statements", "columns")

    def __init__(
        self, build: sa.Executable | Callable[[str], sa.Executable], *, columns: Sequence[str] | None = None
    ) -> None:
        self._build = build
        self._statements: dict[str, sa.Executable] = {}
        self._sqlite: SQLiteForm | None = None
        self.columns = tuple(columns) if columns is not None else None

    def statement(self, dialect: str) -> sa.Executable:
        stmt = self._statements.get(dialect)
        if stmt is None:
            build = self._build
            stmt = build(dialect) if callable(build) else build
            self._statements[dialect] = stmt
        return stmt

    def _direct(self, bridge: SessionBridge) -> tuple[sqlite3.Connection, SQLiteForm]:
        raw = bridge.driver()
        compiled = self._sqlite
        if compiled is None:
            engine = bridge.sync_session.get_bind()
            compiled = self._sqlite = SQLiteForm(self.statement("sqlite"), engine.dialect, self.columns)
        return raw, compiled

    def _session_statement(self, session: AsyncSession | SessionBridge) -> sa.Executable:
        return self.statement(session.get_bind().dialect.name)

    def _on_cursor(
        self,
        bridge: SessionBridge,
        params: Mapping[str, Any],
        take: Callable[[sqlite3.Cursor, SQLiteForm], T],
    ) -> T | None:
        """``take(cursor, form)`` of the statement run on the direct transaction's cursor (a
        driver error raised as the session would raise it); None: an empty ``IN`` list, which
        the session runs."""
        raw, compiled = self._direct(bridge)
        prepared = compiled.args(params)
        if prepared is None:
            return None
        sql, args = prepared
        try:
            return take(raw.execute(sql, args), compiled)
        except sqlite3.Error as exc:
            raise _error(bridge, sql, args, exc) from exc

    async def all(
        self, session: AsyncSession | SessionBridge, params: Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """The rows (as tuples, in the statement's column order) of a SELECT or a RETURNING."""
        params = params or {}
        if isinstance(session, SessionBridge):
            rows = self._on_cursor(session, params, lambda cursor, form: form.rows(cursor.fetchall()))
            if rows is not None:
                return rows
        result = await session.execute(self._session_statement(session), dict(params))
        return [tuple(r) for r in result.all()]

    async def run(
        self, session: AsyncSession | SessionBridge, params: Mapping[str, Any] | None = None
    ) -> int:
        """Run a write once; the number of rows it changed."""
        params = params or {}
        if isinstance(session, SessionBridge):
            changed = self._on_cursor(session, params, lambda cursor, _form: int(cursor.rowcount))
            if changed is not None:
                return changed
        result = await session.execute(self._session_statement(session), dict(params))
        return int(cast(Any, result).rowcount)

    async def many(self, session: AsyncSession | SessionBridge, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run a write once per row of ``rows`` (an executemany); no expanding parameters."""
        if not rows:
            return
        if isinstance(session, SessionBridge):
            raw, compiled = self._direct(session)
            if compiled.expanding:
                raise NotImplementedError("an executemany with an expanding parameter")
            sql = compiled.sql
            args = [cast(tuple[str, list[Any]], compiled.args(row))[1] for row in rows]
            try:
                raw.executemany(sql, args)
            except sqlite3.Error as exc:
                raise _error(session, sql, args, exc) from exc
            return
        await session.execute(self._session_statement(session), [dict(r) for r in rows])
