"""One bad item fails alone (docs/engine.md "One bad item fails alone").

Every path that handles items in batches (webhook group commit, claim, dispatch to
runners, outcome recording, event-trigger intake, pruning, counts) goes through this
module, so the rule is decided once:

- ``bisect``: a batch is written in one transaction (``run``); when that raises, the
  batch is halved and each half tried again, until the item that breaks it is alone.
  That item goes to ``on_poison``, which settles it on its own (records a clear error for
  it in a transaction of its own, or refuses it). The others are written as usual.
- ``each``: work done item by item (decoding, encoding) outside any transaction; an item
  whose work raises goes to ``on_poison``, the others are kept.

A *transient* failure (the database is unavailable, a connection dropped, a timeout) is
not the fault of an item: it is never bisected and never makes an item poison. ``bisect``
stops at it and hands back the items it did not settle, for the caller to retry later.

No database layer is imported here: runner processes use ``each`` too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from flowyard.errors import StorageUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_REASON_CHARS = 300


# PostgreSQL SQLSTATEs of failures that the same statement may not meet again: class 40
# (serialization failure, deadlock), lock not available, statement timeout / cancel,
# class 08 (connection) and 53 (insufficient resources), 57P0x (server shutting down).
_TRANSIENT_STATES = ("40", "08", "53", "55P03", "57014", "57P0")


def is_transient(exc: BaseException) -> bool:
    """A failure of the storage or the network, not of an item: retry, do not isolate.

    ``Database.read()``/``write()`` turn operational database errors (unavailable, locked,
    a connection invalidated) into ``StorageUnavailable``; PostgreSQL's deadlocks and
    serialization failures reach us as plain driver errors and are told by their SQLSTATE.
    """
    if isinstance(exc, (StorageUnavailable, TimeoutError, ConnectionError)):
        return True
    state = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return isinstance(state, str) and state.startswith(_TRANSIENT_STATES)


def reason(exc: BaseException) -> str:
    """A short description of why an item failed: the driver's or encoder's own message
    (a SQLAlchemy ``StatementError`` also prints the statement and its parameters, which
    may hold the item's data: never that), first line, bounded."""
    root: BaseException = getattr(exc, "orig", None) or exc
    text = str(root).strip().splitlines()[0] if str(root).strip() else ""
    text = f"{type(root).__name__}: {text}" if text else type(root).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


@dataclass
class Unsettled(Generic[T]):
    """What ``bisect`` could not settle because of a transient failure (retry them later)."""

    items: list[T] = field(default_factory=list)
    error: BaseException | None = None


async def bisect(
    items: Sequence[T],
    run: Callable[[Sequence[T]], Awaitable[None]],
    on_poison: Callable[[T, BaseException], Awaitable[None]],
) -> Unsettled[T]:
    """Run ``items`` through ``run`` (one transaction per call), isolating the items that
    break it.

    ``run(batch)`` writes the batch and does what follows its commit; it raises to roll
    back. On a non-transient failure the batch is split in two and each half is run on
    its own, recursively; an item that fails alone is passed to ``on_poison(item, exc)``,
    which settles it in a transaction of its own. If ``on_poison`` itself fails, or a
    transient failure occurs, the remaining items are returned unsettled (none of their
    writes happened).

    The cost of a poison item among ``n`` is about ``2 log2 n`` extra transactions; a
    batch without one costs exactly one.
    """
    left: Unsettled[T] = Unsettled()
    pending: list[Sequence[T]] = [items] if items else []
    while pending:
        batch = pending.pop()
        try:
            await run(batch)
            continue
        except Exception as exc:
            if is_transient(exc):
                left.error = exc
            elif len(batch) > 1:
                half = len(batch) // 2
                pending += [batch[half:], batch[:half]]  # the first half runs first
                continue
            else:
                try:
                    await on_poison(batch[0], exc)
                    continue
                except Exception as poison_exc:
                    log.exception("settling a poison item failed")
                    left.error = poison_exc
        # Stopped: everything not yet settled goes back to the caller.
        left.items = [*batch, *(item for rest in reversed(pending) for item in rest)]
        return left
    return left


async def write_alone(write: Callable[[bool], Awaitable[None]]) -> bool | None:
    """Before an item is settled as poison: ``write(count)`` it alone once more as it is
    (``count=True``: what failed may have been a moment's conflict with another process), then
    without its counts (``count=False``: only the count may have broken). Returns which of the
    two wrote it, or None when neither did; a transient failure raises (retry later)."""
    for count in (True, False):
        try:
            await write(count)
        except Exception as again:
            if is_transient(again):
                raise
            continue
        return count
    return None


def each(
    items: Sequence[T],
    work: Callable[[T], R],
    on_poison: Callable[[T, BaseException], None],
) -> list[tuple[T, R]]:
    """``work`` on every item; an item whose work raises goes to ``on_poison`` (which must
    not raise) and is left out. Returns the items that succeeded, with their results."""
    out: list[tuple[T, R]] = []
    for item in items:
        try:
            result = work(item)
        except Exception as exc:
            on_poison(item, exc)
            continue
        out.append((item, result))
    return out
