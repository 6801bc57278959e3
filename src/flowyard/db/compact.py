"""Column types that store the history's repeated values compactly on SQLite (issue 19, storage).

A log entry repeats its tenant, flow and execution (each a 24-hex-digit id, 25 bytes as text)
and its time (a 26-character text), in the row and again in each index that leads with them:
most of an entry's bytes. An execution repeats its own id, tenant and user owner in up to eight
list indexes, and has six times. On SQLite:

- ``CompactId``: an id of flowyard's own form (``flowyard.ids``: 24 lowercase hex digits) is
  stored as its 12 bytes, a BLOB; any other text (a user id an operator named, an old id of
  another form) is stored as it is. The mapping is a function of the value alone, so a bound
  value and a stored cell of the same id are always the same bytes: equality, ``IN`` and the
  indexes that lead with the column work as on the text. Read back, a BLOB is its lowercase hex
  again. Order is kept within each form (a BLOB's bytes compare as its hex digits do); the
  two forms never mix in a comparison of order (ids are only ever compared for equality).
- ``CompactTime``: a UTC time stored as the integer number of microseconds since 1970 (6 to 8
  bytes), in the column's existing ``DATETIME`` declaration (NUMERIC affinity keeps integers).
  Order is time order, as the text's was.

PostgreSQL keeps its own types (``varchar``, ``timestamptz``): both are already compact there.
Every writer of these columns goes through SQLAlchemy's types (``logs.append``, the queue; the
prepared cursor path converts with the same processors), never raw SQL; a ``text()`` statement
that binds or reads one names the column's type (``queue/store.py``), and a UNION's cells are
read with it (``executions/service.py``). Only a column that SQL compares with no other table's
text column may be compact: ``executions.flow_id`` stays text (``flows.id``,
``flow_owners.flow_id``). Migrations 0025 (logs) and 0026 (executions) converted the cells
stored before. The stored forms are frozen: a new form is a new type and a migration.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from flowyard.db.base import UTCDateTime

_OWN_ID = re.compile(r"[0-9a-f]{24}")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def id_cell(value: str) -> str | bytes:
    """The SQLite cell of an id: its 12 bytes when it is of flowyard's form, else the text."""
    return bytes.fromhex(value) if len(value) == 24 and _OWN_ID.fullmatch(value) else value


def time_cell(value: datetime) -> int:
    """The SQLite cell of a time: microseconds since 1970, UTC (a naive time is UTC)."""
    aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return (aware - EPOCH) // _MICROSECOND


def time_of(cell: int) -> datetime:
    return EPOCH + timedelta(microseconds=cell)


class CompactId(sa.types.TypeDecorator[str]):
    """A ``varchar(length)`` id; on SQLite 12 bytes when it is one of flowyard's own."""

    impl = sa.String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None or dialect.name != "sqlite" or not isinstance(value, str):
            return value
        return id_cell(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return value.hex() if isinstance(value, bytes) else value


class _RawDateTime(sa.types.TypeEngine[Any]):
    """SQLite's ``DATETIME`` declaration with the values passed as they are (integers here):
    not a ``DateTime``, which SQLite's dialect would replace by its own text-formatting type."""

    __visit_name__ = "DATETIME"


class CompactTime(UTCDateTime):
    """``UTCDateTime`` (always UTC, aware on the way out), but on SQLite an integer of
    microseconds since 1970 rather than text."""

    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(_RawDateTime())
        return super().load_dialect_impl(dialect)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is not None and dialect.name == "sqlite":
            return time_cell(value)
        return super().process_bind_param(value, dialect)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if isinstance(value, int):
            return time_of(value)
        if isinstance(value, str):  # a cell from before migration 0025, if one was missed
            value = datetime.fromisoformat(value)
        return super().process_result_value(value, dialect)
