"""compact execution rows: on SQLite, an execution's ids as 12 bytes, its times as integers,
no queue group once finished, and log messages packed

Storage per execution (issue 19), after 0025 did the same for ``logs``. From this revision:

- ``executions.id``, ``tenant``, ``owner_user``, ``retry_of``, ``rerun_of`` and
  ``parent_execution_id`` are ``flowyard.db.compact.CompactId`` and its six times
  (``created_at``, ``started_at``, ``finished_at``, ``scheduled_for``, ``lease_expires_at``,
  ``resume_at``) ``CompactTime``: on SQLite an id of flowyard's form is stored as its 12 bytes
  and a time as microseconds since 1970, in the row and in each list index that carries them.
  ``flow_id`` stays text: SQL compares it with ``flows.id`` and ``flow_owners.flow_id``.
- ``executions.queue_group`` is cleared when an execution finishes (``queue/status.py``): it
  is read for queued and running rows only.
- ``logs.message`` is ``flowyard.db.packed.PackedText``: on SQLite a message that deflating
  against a dictionary of the engine's phrases shortens is stored as a BLOB of a version byte
  (1) and the deflated UTF-8.

- The unique ``(flow_id, scheduled_for)`` that makes a cron tick one execution becomes a
  partial unique index over the rows that have a scheduled time (a tick's): the executions of
  other triggers, nearly all, are no longer in it (~40 bytes each on SQLite). On SQLite the
  table is copied to drop the constraint (SQLite's own procedure); PostgreSQL drops it.

This migration converts the cells stored before on SQLite, batch by batch in rowid order, to
the forms the types write (copied here: a migration's code is frozen, and so are the stored
forms). PostgreSQL: nothing changes (``varchar`` and ``timestamptz`` are compact there; the
finished rows' queue groups are left to age out rather than rewriting every row).

The downgrade turns the ids, times and messages back into text. The cleared queue groups are
not restored: no version reads a finished execution's group.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-08 01:20:00.000000
"""

from __future__ import annotations

import re
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_BATCH = 20_000
_IDS = ("id", "tenant", "owner_user", "retry_of", "rerun_of", "parent_execution_id")
_TIMES = ("created_at", "started_at", "finished_at", "scheduled_for", "lease_expires_at", "resume_at")
_FINISHED = ("succeeded", "failed", "cancelled")
_OWN_ID = re.compile(r"[0-9a-f]{24}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def id_cell(value: str) -> str | bytes:
    """An id of flowyard's form (24 lowercase hex digits) as its 12 bytes; any other as it is."""
    return bytes.fromhex(value) if len(value) == 24 and _OWN_ID.fullmatch(value) else value


def time_cell(value: datetime) -> int:
    """A time (naive: UTC) as microseconds since 1970."""
    aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return (aware - _EPOCH) // _MICROSECOND


def time_of(cell: int) -> datetime:
    return _EPOCH + timedelta(microseconds=cell)


# db/packed.py's stored form of a message: version byte 1, then the UTF-8 deflated (raw,
# window 2**11, level 9, memLevel 1) against this dictionary.
_TEXT_ZDICT = (
    b"tick  skipped: the previous run of the flow has not finished"
    b"error flow  not started: it execution  failed: step  attempt  of  failed: "
    b" (http) (code) (jsonata) (log) (webhook) ran 1 time(s) in 0.0 ms, 1 message(s) out, 2 attempts"
    b"step  (webhook) ran 1 time(s) in 0.1 ms, 1 message(s) out"
)


def pack_text(value: str) -> str | bytes:
    body = value.encode()
    if len(body) > 16:
        deflater = zlib.compressobj(9, zlib.DEFLATED, -11, 1, zlib.Z_DEFAULT_STRATEGY, _TEXT_ZDICT)
        packed = deflater.compress(body) + deflater.flush()
        if len(packed) + 1 < len(body):
            return b"\x01" + packed
    return value


def text_of(cell: bytes) -> str | None:
    """A packed message's text; None when it cannot be read (left as it is)."""
    try:
        if cell[:1] == b"\x01":
            inflater = zlib.decompressobj(-11, _TEXT_ZDICT)
            body = inflater.decompress(cell[1:]) + inflater.flush()
            return body.decode() if inflater.eof else None
    except (zlib.error, UnicodeDecodeError):
        return None
    return None


def _stored_time(cell: Any) -> Any:
    return time_cell(datetime.fromisoformat(cell)) if isinstance(cell, str) else cell


def _text_time(cell: Any) -> Any:
    if isinstance(cell, int):
        return time_of(cell).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
    return cell


def _batches(conn: sa.Connection, table: str, columns: tuple[str, ...]) -> Any:
    after = 0
    names = ", ".join(columns)
    while rows := list(
        conn.exec_driver_sql(
            f"SELECT rowid, {names} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT {_BATCH}", (after,)
        )
    ):
        yield rows
        after = rows[-1][0]


def _executions(*, forward: bool) -> None:
    conn = op.get_bind()
    columns = (*_IDS, *_TIMES, "status", "queue_group")
    written = (*_IDS, *_TIMES, "queue_group")
    update = f"UPDATE executions SET {', '.join(f'{c} = ?' for c in written)} WHERE rowid = ?"
    for rows in _batches(conn, "executions", columns):
        changed = []
        for rowid, *cells in rows:
            ids, times = cells[: len(_IDS)], cells[len(_IDS) : len(_IDS) + len(_TIMES)]
            status, group = cells[-2:]
            if forward:
                new = [id_cell(v) if isinstance(v, str) else v for v in ids]
                new += [_stored_time(v) for v in times]
                new.append(None if status in _FINISHED else group)
            else:
                new = [v.hex() if isinstance(v, bytes) else v for v in ids]
                new += [_text_time(v) for v in times]
                new.append(group)
            if new != [*ids, *times, group]:
                changed.append((*new, rowid))
        if changed:
            conn.exec_driver_sql(update, changed)


def _messages(*, forward: bool) -> None:
    conn = op.get_bind()
    for rows in _batches(conn, "logs", ("message",)):
        changed = []
        for rowid, message in rows:
            if forward and isinstance(message, str):
                cell: Any = pack_text(message)
            elif not forward and isinstance(message, bytes):
                cell = text_of(message)
                cell = message if cell is None else cell
            else:
                continue
            if cell != message:
                changed.append((cell, rowid))
        if changed:
            conn.exec_driver_sql("UPDATE logs SET message = ? WHERE rowid = ?", changed)


_UNIQUE = "uq_executions_flow_id_scheduled_for"
_CONSTRAINT = f"CONSTRAINT {_UNIQUE} UNIQUE (flow_id, scheduled_for)"
_SCHEDULED = "scheduled_for IS NOT NULL"


def _rebuild(conn: sa.Connection, *, constraint: bool) -> None:
    """SQLite: the table again with or without its unique constraint (SQLite drops or adds a
    table constraint only by copying the table): SQLite's documented procedure, with the
    table's and its indexes' own SQL as they are stored."""
    (table_sql,) = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'executions'"
    ).one()
    index_sqls = [
        sql
        for (sql,) in conn.exec_driver_sql(
            "SELECT sql FROM sqlite_schema"
            " WHERE type = 'index' AND tbl_name = 'executions' AND sql IS NOT NULL"
        )
    ]
    if constraint:
        body = table_sql.rstrip().removesuffix(")").rstrip()
        new_sql = f"{body}, \n\t{_CONSTRAINT}\n)"
    else:
        new_sql, n = re.subn(r",\s*" + re.escape(_CONSTRAINT), "", table_sql)
        if n != 1:
            raise RuntimeError(f"executions: {_CONSTRAINT} not found in its table's SQL")
    new_sql = new_sql.replace('CREATE TABLE "executions"', 'CREATE TABLE "executions_rebuilt"', 1)
    # The driver opens a transaction only before a DML statement: on a database with nothing to
    # convert, a CREATE TABLE commits on its own, and an interrupted run leaves the copy behind.
    conn.exec_driver_sql("DROP TABLE IF EXISTS executions_rebuilt")
    conn.exec_driver_sql(new_sql)
    conn.exec_driver_sql("INSERT INTO executions_rebuilt SELECT * FROM executions")
    conn.exec_driver_sql("DROP TABLE executions")
    conn.exec_driver_sql("ALTER TABLE executions_rebuilt RENAME TO executions")
    for sql in index_sqls:
        conn.exec_driver_sql(sql)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "sqlite":
        _executions(forward=True)
        _messages(forward=True)
        _rebuild(conn, constraint=False)
    else:
        op.drop_constraint(_UNIQUE, "executions", type_="unique")
    op.create_index(
        _UNIQUE,
        "executions",
        ["flow_id", "scheduled_for"],
        unique=True,
        sqlite_where=sa.text(_SCHEDULED),
        postgresql_where=sa.text(_SCHEDULED),
    )


def downgrade() -> None:
    conn = op.get_bind()
    op.drop_index(_UNIQUE, table_name="executions", if_exists=True)  # re-runnable (see _rebuild)
    if conn.dialect.name == "sqlite":
        _rebuild(conn, constraint=True)
        _executions(forward=False)
        _messages(forward=False)
    else:
        op.create_unique_constraint(_UNIQUE, "executions", ["flow_id", "scheduled_for"])
