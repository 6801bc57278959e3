"""A JSON document stored compressed on SQLite: the steps of an execution (issue 19, storage).

An execution's steps document (``queue/steps.py``) is most of its row: ~850 bytes of JSON
for three steps, the same dozen keys in every step. On SQLite it is stored as a BLOB of one
version byte and the document's JSON (orjson) deflated against a preset dictionary of those
keys (``_ZDICT``): ~110 bytes for the same three steps. PostgreSQL keeps its ``json`` column
as before (the server compresses values large enough to be TOASTed).

The column keeps its declared ``TEXT`` type on SQLite, so no table is rebuilt: a BLOB in a
TEXT column stays a BLOB, and cells written before this (JSON text) are read as they were.
A value is written compressed only when that makes it smaller (else the ``RAW`` version byte
and the JSON as it is). Reading is total, as every stored JSON cell is
(``jsonvalue.loads_stored``): a cell that cannot be inflated or parsed reads as
``jsonvalue.UNREADABLE`` with a warning, and ``flowyard check`` names it (``unpack_checked``).

Deflate's state is set up once (``_PROTO``, a 2 KiB window: documents are small) and copied
per value: making a compressor with a dictionary costs ~150 µs, copying this one ~9 µs.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from flowyard.db.base import JsonValue, QuotedText
from flowyard.jsonvalue import UNREADABLE, loads_stored

log = logging.getLogger(__name__)

RAW = 0  # version byte: the JSON as it is
DEFLATED_V1 = 1  # version byte: raw deflate, window 2**11, preset dictionary _ZDICT (v1)

_WBITS = -11
_LEVEL = 1  # measured: level 6 saves ~7 % more bytes for ~40 % more CPU
# What a steps document repeats (queue/steps.py), most common last (deflate finds the nearest
# match first). Never change it: cells written with it name it by their version byte; a new
# dictionary is a new version byte, and this one stays for reading.
_ZDICT = (
    b'"input":{},"inputs":{},"error":"'
    b'"status":"failed","error":null,"status":"skipped","status":"waiting",'
    b'"attemptErrors":[]},{"nodeId":"","componentId":"http","function":null,"status":"succeeded",'
    b'"componentId":"log","componentId":"jsonata","componentId":"webhook","componentId":"code",'
    b'"runs":1,"messagesIn":1,"messagesOut":1,"durationMs":0.0,'
    b'"startedAt":"2026-12-01T00:00:00.000Z","finishedAt":"2026-12-01T00:00:00.000Z",'
    b'"error":null,"output":{},"attempts":1,"attemptErrors":[]},{"nodeId":"'
)
_PROTO = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, 1, zlib.Z_DEFAULT_STRATEGY, _ZDICT)


def _deflate(proto: Any, body: bytes) -> bytes:
    """``body`` deflated from a copy of a prepared compressor (its dictionary set)."""
    deflater = proto.copy()
    return bytes(deflater.compress(body) + deflater.flush())


def _inflate(body: bytes, zdict: bytes) -> bytes:
    """A raw deflate stream against ``zdict``; ``ValueError`` (or ``zlib.error``) if broken."""
    inflater = zlib.decompressobj(_WBITS, zdict)
    out = inflater.decompress(body) + inflater.flush()
    if not inflater.eof:
        raise ValueError("a truncated deflate stream")
    return out


def pack(value: Any) -> bytes:
    """The stored form of a JSON value (not None): version byte + body."""
    body = orjson.dumps(value)
    if len(body) > 64:
        packed = _deflate(_PROTO, body)
        if len(packed) < len(body):
            return bytes((DEFLATED_V1,)) + packed
    return bytes((RAW,)) + body


def unpack_checked(raw: Any) -> Any:
    """The value of a stored cell; raises ``ValueError`` (zlib's error, orjson's decode error)
    when it cannot be read. A str is a cell written as JSON text (before packing, or by
    PostgreSQL's driver): parsed as it is."""
    if isinstance(raw, str):
        return orjson.loads(raw)
    if isinstance(raw, memoryview | bytearray):
        raw = bytes(raw)
    if not isinstance(raw, bytes) or not raw:
        raise ValueError(f"not a packed JSON cell ({type(raw).__name__})")
    version = raw[0]
    if version == DEFLATED_V1:
        return orjson.loads(_inflate(raw[1:], _ZDICT))
    if version == RAW:
        return orjson.loads(raw[1:])
    raise ValueError(f"an unknown version byte {version}")


def unpack(raw: Any) -> Any:
    """Read back a stored cell; total (``jsonvalue.loads_stored``'s rule): a cell that cannot
    be read is served as ``UNREADABLE`` with a warning, so it fails alone."""
    if raw is None:
        return None
    if isinstance(raw, str | int | float):
        return loads_stored(raw)
    try:
        return unpack_checked(raw)
    except (ValueError, zlib.error) as exc:
        log.warning("a stored packed JSON value could not be read (%s); run `flowyard check`", exc)
        return dict(UNREADABLE)


def raw_cell(column: Any, *, sqlite: bool) -> Any:
    """A packed column as stored, for the reads that must tell a bad cell from a good one
    (``unpack_checked``) rather than fail the statement: SQLite's BLOB (or old text) as it is,
    PostgreSQL's ``json`` as text (its driver would parse it itself)."""
    return sa.type_coerce(column, sa.types.NullType()) if sqlite else sa.cast(column, sa.Text)


def unpack_or_none(raw: Any) -> Any:
    """``unpack_checked``, or None for a cell that cannot be read."""
    if raw is None:
        return None
    try:
        return unpack_checked(raw)
    except (ValueError, zlib.error):
        return None


class PackedJson(sa.types.TypeDecorator[Any]):
    """``JsonValue`` on PostgreSQL; on SQLite a TEXT column holding ``pack``'s BLOBs.

    Python ``None`` is SQL ``NULL`` on SQLite; PostgreSQL keeps ``json``'s own rule."""

    impl = JsonValue
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.Text())
        return dialect.type_descriptor(JsonValue())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "sqlite" or value is None:
            return value
        return pack(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "sqlite":
            return value
        return unpack(value)


# A log entry's message (``logs.message``), stored compressed on SQLite the same way: the
# engine's messages repeat a few phrases (the runner's step summary above all, ~60 bytes of
# text in each of an execution's entries, ~15 packed). A cell is either text (a message that
# packing would not shorten, or one stored before migration 0026) or a BLOB of
# ``TEXT_DEFLATED_V1`` and the message's UTF-8 deflated against ``_TEXT_ZDICT``. Never change
# the dictionary: a new one is a new version byte, and this one stays for reading.
TEXT_DEFLATED_V1 = 1
_TEXT_ZDICT = (
    b"tick  skipped: the previous run of the flow has not finished"
    b"error flow  not started: it execution  failed: step  attempt  of  failed: "
    b" (http) (code) (jsonata) (log) (webhook) ran 1 time(s) in 0.0 ms, 1 message(s) out, 2 attempts"
    b"step  (webhook) ran 1 time(s) in 0.1 ms, 1 message(s) out"
)
UNREADABLE_TEXT = "(this message could not be read from the database)"
# memLevel 1: the same bytes for messages this short, and a copy of the state costs ~2 µs, not ~5.
_TEXT_PROTO = zlib.compressobj(9, zlib.DEFLATED, _WBITS, 1, zlib.Z_DEFAULT_STRATEGY, _TEXT_ZDICT)


def pack_text(value: str) -> str | bytes:
    """The SQLite cell of a message: deflated when that is shorter, else the text itself."""
    body = value.encode()
    if len(body) > 16:
        packed = _deflate(_TEXT_PROTO, body)
        if len(packed) + 1 < len(body):
            return bytes((TEXT_DEFLATED_V1,)) + packed
    return value


def unpack_text(cell: Any) -> Any:
    """A stored message: text as it is; a packed BLOB inflated. A BLOB that cannot be read is
    served as a placeholder with a warning (it fails alone, as a JSON cell does)."""
    if not isinstance(cell, bytes | bytearray | memoryview):
        return cell
    raw = bytes(cell)
    try:
        if not raw or raw[0] != TEXT_DEFLATED_V1:
            raise ValueError(f"an unknown version byte {raw[:1]!r}")
        return _inflate(raw[1:], _TEXT_ZDICT).decode()
    except (ValueError, zlib.error) as exc:  # UnicodeDecodeError is a ValueError
        log.warning("a stored packed message could not be read (%s)", exc)
        return UNREADABLE_TEXT


class PackedText(QuotedText):
    """``QuotedText``; on SQLite a message is stored as ``pack_text``'s cell."""

    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        value = super().process_bind_param(value, dialect)
        if dialect.name != "sqlite" or not isinstance(value, str):
            return value
        return pack_text(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return unpack_text(value)
