"""The little SQL that differs between SQLite and PostgreSQL, in one place."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import as_utc, utcnow
from flowyard.db.prepared import Prepared


def dialect_name(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


def insert_ignore(
    session: AsyncSession, table: Any, index_elements: Sequence[str], index_where: Any = None
) -> Any:
    """INSERT ... ON CONFLICT (index_elements) [WHERE index_where] DO NOTHING, for either
    database (``index_where``: the predicate of a partial unique index, as it declares it)."""
    return insert_ignore_for(dialect_name(session), table, index_elements, index_where)


def insert_ignore_for(
    dialect: str, table: Any, index_elements: Sequence[str], index_where: Any = None
) -> Any:
    """``insert_ignore`` for a dialect named (a statement built once per dialect)."""
    return dialect_insert(dialect, table).on_conflict_do_nothing(
        index_elements=list(index_elements), index_where=index_where
    )


def dialect_insert(dialect: str, table: Any) -> Any:
    """The dialect's own INSERT (with ``on_conflict_do_nothing`` / ``_do_update``)."""
    module: Any = postgresql if dialect == "postgresql" else sqlite
    return module.insert(table)


def joined_strings(session: AsyncSession, column: Any) -> Any:
    """An aggregate: the group's values of ``column`` joined by commas, in no given order
    (``group_concat`` on SQLite, ``string_agg`` on PostgreSQL); for values without commas."""
    if dialect_name(session) == "postgresql":
        return sa.func.string_agg(column, sa.literal_column("','"), type_=sa.Text)
    return sa.func.group_concat(column, sa.literal_column("','"), type_=sa.Text)


def newest_of(session: AsyncSession, arms: Sequence[sa.Select[Any]], *, limit: int, offset: int) -> Any:
    """A page (newest first) of the ``id`` column that the disjoint ``arms`` select, each arm
    one index range already in ``id`` order. SQLite merges the ranges as they come
    (``MERGE (UNION ALL)``, no sort); PostgreSQL does not merge a ``UNION ALL`` of joins, so
    each arm stops at ``offset + limit`` rows and only those few are sorted."""
    newest: sa.UnaryExpression[Any] = sa.desc(sa.literal_column("id"))
    if dialect_name(session) == "postgresql":
        deep = offset + limit
        arms = [arm.order_by(newest).limit(deep).subquery().select() for arm in arms]
    return sa.union_all(*arms).order_by(newest).limit(limit).offset(offset)


def distinct_values(column: Any, *where: Any, cap: int) -> sa.Select[Any]:
    """The distinct non-NULL values of ``column`` among the rows matching the equalities
    ``where``, ascending, at most ``cap``: a loose index scan (one index probe per value, a
    recursive step to the next larger value) over an index that starts with the columns of
    ``where`` followed by ``column``. A plain ``DISTINCT`` would read every matching row."""

    def first(after: Any = None) -> Any:
        query = sa.select(column).where(*where, column.is_not(None) if after is None else column > after)
        return query.order_by(column).limit(1).scalar_subquery()

    seen = sa.select(first().label("v")).cte("seen", recursive=True)
    seen = seen.union_all(sa.select(first(seen.c.v)).where(seen.c.v.is_not(None)))
    return sa.select(seen.c.v).where(seen.c.v.is_not(None)).limit(cap)


@functools.cache
def _upsert(
    dialect: str,
    table: Any,
    keys: tuple[str, ...],
    counter: str,
    replace: tuple[str, ...],
    bits: tuple[str, ...],
) -> Any:
    """The upsert statement of ``increment``, built once per shape: statements are immutable,
    and building one is not cheap (each ``excluded`` makes an alias of the whole table)."""
    stmt = dialect_insert(dialect, table)
    excluded = stmt.excluded
    set_ = {counter: table.c[counter] + excluded[counter]}
    for name in replace:
        set_[name] = excluded[name]
    for name in bits:
        set_[name] = table.c[name].op("|")(excluded[name])
    return stmt.on_conflict_do_update(index_elements=list(keys), set_=set_)


async def increment(
    session: AsyncSession,
    table: Any,
    keys: Sequence[str],
    counter: str,
    rows: Sequence[Mapping[str, Any]],
    replace: Sequence[str] = (),
    bits: Sequence[str] = (),
) -> None:
    """Upsert ``rows``: add their ``counter`` to the stored one, overwrite ``replace`` columns
    and OR the integer ``bits`` columns into the stored ones."""
    if not rows:
        return
    # Core table rather than ORM class: an executemany upsert, not an ORM bulk operation.
    table = getattr(table, "__table__", table)
    stmt = _upsert_prepared(table, tuple(keys), counter, tuple(replace), tuple(bits), tuple(rows[0]))
    # Sorted so that concurrent writers on PostgreSQL lock counter rows in one order.
    ordered = sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys))
    await stmt.many(session, ordered)


@functools.cache
def _upsert_prepared(
    table: Any,
    keys: tuple[str, ...],
    counter: str,
    replace: tuple[str, ...],
    bits: tuple[str, ...],
    columns: tuple[str, ...],
) -> Prepared:
    return Prepared(lambda dialect: _upsert(dialect, table, keys, counter, replace, bits), columns=columns)


async def db_now(session: AsyncSession) -> datetime:
    """The one clock processes on different machines agree on: PostgreSQL's ``now()``.

    SQLite is a file on one machine, so every process using it shares this machine's clock.
    """
    if dialect_name(session) == "postgresql":
        value = await session.scalar(sa.select(sa.func.now()))
        if value is not None:
            return as_utc(value)
    return utcnow()
