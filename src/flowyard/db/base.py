"""Declarative base, naming convention and column types shared by every domain."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flowyard.clock import utcnow

# Stable constraint names on both databases, so migrations can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def partial_index(name: str, *columns: str, where: str | sa.TextClause, unique: bool = False) -> sa.Index:
    """An index over the rows matching ``where`` only, with the same predicate on both
    databases (a query uses it only when its own WHERE holds that predicate as written)."""
    predicate = sa.text(where) if isinstance(where, str) else where
    return sa.Index(name, *columns, unique=unique, postgresql_where=predicate, sqlite_where=predicate)


class QuotedText(sa.types.TypeDecorator[str]):
    """Text that quotes what a step or a far side said (an execution's error, a log message, a
    flow's status message): a NUL character in it is stored as U+FFFD on both databases.
    PostgreSQL's text cannot hold one, and would refuse the whole statement (an outcome, a batch
    of log entries) for it."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Always UTC, always aware on the way out.

    SQLite keeps datetimes as text without a zone: storing naive UTC keeps text
    order equal to time order there.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# A column that always holds an array or an object (validated before it is written).
Json = sa.JSON


class JsonValue(sa.JSON):
    """A column that may hold any JSON value, scalars at the top level too.

    PostgreSQL: ``json``, as ``Json``. SQLite: declared ``TEXT``, so the column has TEXT
    affinity and keeps the serialised text as it is; a column declared ``JSON`` has NUMERIC
    affinity, which turns the text ``42``, `` 1.0`` or ``-0`` into a number (migration 0014
    converted the columns and the numbers older versions stored). Values are read and
    written as ``Json`` does (flowyard.jsonvalue).
    """

    cache_ok = True


@compiles(JsonValue, "sqlite")
def _json_value_sqlite(type_: JsonValue, compiler: Any, **kw: Any) -> str:
    return "TEXT"


Id = sa.String(24)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class Timestamped:
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, nullable=False)
