"""What a JSON value may be in flowyard, decided once: how deep it may nest, and how it is
read at the doors and read back from the store.

Every door where JSON enters (webhook and API bodies, broker payloads) reads it with
``loads``; the runner checks what a step returns with ``check_depth`` before it goes
anywhere. So a value that reaches the runner IPC or the store nests at most ``MAX_DEPTH``
levels: orjson parses up to 1,024 levels but writes only up to 254, and the runner IPC
(a frame, a message, an outcome, the steps list, a step, the output samples) and the
stored steps document wrap a value in a few more. The margin keeps every wrapper writable.

Depth counts containers: a scalar is 0 deep, ``[]`` and ``{}`` 1, ``[[1]]`` 2.

Imports nothing of flowyard: the runner processes and every layer may use it.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

log = logging.getLogger(__name__)

MAX_DEPTH = 128

JSONDecodeError = orjson.JSONDecodeError


class TooDeep(ValueError):
    """A JSON value nests deeper than MAX_DEPTH."""

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        self.limit = limit
        # Completes a sentence: "The body nests deeper than 128 levels ..."
        super().__init__(f"nests deeper than {limit} levels of arrays and objects (the limit)")


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON, or what a component returned) nests deeper than
    ``limit``. Iterative: a deep value cannot exhaust the Python stack here."""
    if not isinstance(value, dict | list | tuple):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list | tuple):
                push((child, depth + 1))
    return False


def nul_paths(value: Any) -> list[str]:
    """JSON paths (``a.b[0].c``) of the strings in ``value``, values or keys, that contain
    U+0000; sorted. The one NUL rule: PostgreSQL cannot store U+0000 in text (nor ``jsonb``),
    so every API body whose text is stored is refused with it (``api.deps.read_json``).
    A key holding NUL is named with ``\\u0000`` in its place and not looked into."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                found.append(at)
        elif isinstance(item, dict):
            for key, sub in item.items():
                sub_path = f"{at}.{key}" if at else str(key)
                if "\x00" in key:
                    found.append(sub_path.replace("\x00", "\\u0000"))
                else:
                    stack.append((sub, sub_path))
        elif isinstance(item, list):
            stack.extend((sub, f"{at}[{i}]") for i, sub in enumerate(item))
    return sorted(found)


def size_over(value: Any, limit: int) -> int | None:
    """The size of ``value`` written as JSON when it is over ``limit`` bytes, else None. The
    runner checks each value a step produces with it, after ``depth_exceeds`` (orjson writes at
    most 254 levels). A value orjson cannot write is not judged here (the IPC refuses it)."""
    if isinstance(value, bool | int | float | None):
        return None
    try:
        size = len(orjson.dumps(value))
    except TypeError:
        return None
    return size if size > limit else None


def size_text(n: int) -> str:
    """``1 MiB``, ``512 KiB`` or ``1500 bytes``: how the size limits are named in errors."""
    if n % 1048576 == 0:
        return f"{n // 1048576} MiB"
    if n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} bytes"


class TooBig(ValueError):
    """A value a step produced is larger, written as JSON, than a size limit (SPEC §6)."""

    def __init__(self, size: int, limit: int, setting: str) -> None:
        self.size = size
        self.limit = limit
        # Completes a sentence: "its output is 12582914 bytes as JSON, over the 1 MiB limit (...)"
        super().__init__(f"is {size} bytes as JSON, over the {size_text(limit)} limit ({setting})")


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise ``TooDeep`` when ``value`` nests deeper than ``limit``."""
    if depth_exceeds(value, limit):
        raise TooDeep(limit)


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON that enters from outside: ``orjson.JSONDecodeError`` when it is not JSON,
    ``TooDeep`` when it nests deeper than ``MAX_DEPTH``.

    A body with at most ``MAX_DEPTH`` opening brackets (counting those inside strings too)
    cannot nest deeper: only bodies with more are walked.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in exc.msg:  # orjson's own limit (1,024): deeper than ours too
            raise TooDeep() from None
        raise
    data = raw.encode() if isinstance(raw, str) else bytes(raw) if isinstance(raw, memoryview) else raw
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        check_depth(value)
    return value


# What a stored cell that cannot be read is served as, so that one bad row fails alone: a
# read of many rows (a list page, a claim) goes on, and the row says what is wrong with it.
UNREADABLE = {
    "unreadable": "This stored JSON value could not be read; `flowyard check` names it and "
    "`flowyard check --quarantine` keeps its text readable."
}


def loads_stored(value: Any) -> Any:
    """Read back a stored JSON cell (the engine's ``json_deserializer``). Total: a cell an
    older flowyard let SQLite keep as a number (a column of NUMERIC affinity turned the text
    ``42`` into the integer 42) reads as that number; text that is not JSON, or nests deeper
    than orjson reads, reads as ``UNREADABLE`` (a copy) with a warning, never as an exception
    that would fail every other row of the same statement. The paths that must tell a bad
    cell from a good one read it as text and use ``loads`` (the claim, ``flowyard check``)."""
    if isinstance(value, int | float):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        log.warning("a stored JSON value could not be read (%s); run `flowyard check`", exc.msg)
        return dict(UNREADABLE)


def dumps_stored(value: Any) -> str:
    """Write a JSON cell (the engine's ``json_serializer``)."""
    return orjson.dumps(value).decode()
