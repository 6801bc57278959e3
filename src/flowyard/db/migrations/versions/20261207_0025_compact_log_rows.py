"""compact log rows: on SQLite, a log entry's ids as 12 bytes and its time as an integer

Storage per execution (issue 19). From this revision the ``logs`` columns ``tenant``,
``user_id``, ``flow_id`` and ``execution_id`` are ``flowyard.db.compact.CompactId`` and
``timestamp`` is ``CompactTime``: on SQLite an id of flowyard's form is stored as its 12 bytes
and the time as microseconds since 1970 (an integer), in the row and in every index that
leads with them. This migration converts the cells stored before, batch by batch in id order,
to the forms the types write (copied here, as a migration's code is frozen: the stored forms
are too, ``db/compact.py`` says so). It also clears ``user_id``
on the entries of a tenant: from this revision ``logs.append`` records the user owner only on
an entry of no tenant, its only reader (``iam.visibility.tenant_data_clause``).

``logs.data`` needs no conversion on the way up: ``PackedJson`` reads the JSON text stored
before. The downgrade turns the packed cells written since back into JSON text (the release
before reads ``data`` as text).

PostgreSQL: nothing changes but the cleared ``user_id`` (``varchar`` and ``timestamptz`` are
already compact there).

The downgrade turns the cells back into text. The cleared user ids are not restored: no
version reads the user of an entry that has a tenant.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 22:40:00.000000
"""

from __future__ import annotations

import re
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_BATCH = 20_000
_IDS = ("tenant", "user_id", "flow_id", "execution_id")
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


# db/packed.py's stored form of a JSON value: a version byte, then the JSON (0) or the JSON
# deflated (raw, window 2**11) against this dictionary (1).
_ZDICT = (
    b'"input":{},"inputs":{},"error":"'
    b'"status":"failed","error":null,"status":"skipped","status":"waiting",'
    b'"attemptErrors":[]},{"nodeId":"","componentId":"http","function":null,"status":"succeeded",'
    b'"componentId":"log","componentId":"jsonata","componentId":"webhook","componentId":"code",'
    b'"runs":1,"messagesIn":1,"messagesOut":1,"durationMs":0.0,'
    b'"startedAt":"2026-12-01T00:00:00.000Z","finishedAt":"2026-12-01T00:00:00.000Z",'
    b'"error":null,"output":{},"attempts":1,"attemptErrors":[]},{"nodeId":"'
)


def _json_text(cell: bytes) -> str | None:
    """A packed cell's JSON text; None when it cannot be read (left as it is: ``flowyard
    check`` names it)."""
    try:
        if cell[:1] == b"\x00":
            return cell[1:].decode()
        if cell[:1] == b"\x01":
            inflater = zlib.decompressobj(-11, _ZDICT)
            body = inflater.decompress(cell[1:]) + inflater.flush()
            return body.decode() if inflater.eof else None
    except (zlib.error, UnicodeDecodeError):
        return None
    return None


def _unpack_data() -> None:
    conn = op.get_bind()
    after = 0
    while rows := list(
        conn.exec_driver_sql(
            f"SELECT id, data FROM logs WHERE id > ? AND typeof(data) = 'blob' ORDER BY id LIMIT {_BATCH}",
            (after,),
        )
    ):
        texts = [(text, eid) for eid, cell in rows if (text := _json_text(bytes(cell))) is not None]
        if texts:
            conn.exec_driver_sql("UPDATE logs SET data = ? WHERE id = ?", texts)
        after = rows[-1][0]


def _rows(conn: sa.Connection, after: int) -> list[Any]:
    return list(
        conn.exec_driver_sql(
            f"SELECT id, timestamp, {', '.join(_IDS)} FROM logs WHERE id > ? ORDER BY id LIMIT {_BATCH}",
            (after,),
        )
    )


def _stored_time(cell: Any) -> Any:
    if isinstance(cell, str):
        return time_cell(datetime.fromisoformat(cell))
    return cell


def _text_time(cell: Any) -> Any:
    if isinstance(cell, int):
        return time_of(cell).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
    return cell


def _convert(*, forward: bool) -> None:
    conn = op.get_bind()
    update = f"UPDATE logs SET timestamp = ?, {', '.join(f'{c} = ?' for c in _IDS)} WHERE id = ?"
    after = 0
    while rows := _rows(conn, after):
        changed = []
        for row in rows:
            eid, when, tenant, user, flow, execution = row
            if forward:
                cells = [_stored_time(when)] + [
                    id_cell(v) if isinstance(v, str) else v
                    for v in (tenant, None if tenant is not None else user, flow, execution)
                ]
            else:
                cells = [_text_time(when)] + [
                    v.hex() if isinstance(v, bytes) else v for v in (tenant, user, flow, execution)
                ]
            if cells != [when, tenant, user, flow, execution]:
                changed.append((*cells, eid))
        if changed:
            conn.exec_driver_sql(update, changed)
        after = rows[-1][0]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _convert(forward=True)
    else:
        op.execute("UPDATE logs SET user_id = NULL WHERE tenant IS NOT NULL AND user_id IS NOT NULL")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _convert(forward=False)
        _unpack_data()
