"""The one way log entries are written: :func:`append` (a batch, one executemany INSERT, for
the hot path of recording outcomes) and :func:`append_one`. The engine (queue, lifecycle,
scheduler) calls these in its own transaction, so an entry commits with the change it tells
of. The runner processes build their entries as plain dicts of the same columns (they do not
import the database layer); the queue appends them with the outcome. Pruning deletes old
entries in ``queue/pruner.py``; nothing else writes ``logs``.

Imports: the log model, the clock, ``db.prepared`` and SQLAlchemy only (the engine may import
this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import utcnow
from flowyard.db.prepared import insert_into
from flowyard.logs.models import LogEntry

# A Core insert: an executemany without the ORM's unit of work.
_LOGS = cast(sa.Table, LogEntry.__table__)


def entry(
    level: str,
    message: str,
    *,
    tenant: str | None,
    user_id: str | None,
    flow_id: str | None,
    execution_id: str | None = None,
    step_id: str | None = None,
    component_id: str | None = None,
    data: Any = None,
    timestamp: datetime | None = None,
) -> dict[str, Any]:
    """One entry as :func:`append` takes it (the row's columns)."""
    return {
        "timestamp": timestamp or utcnow(),
        "level": level,
        "message": message,
        "tenant": tenant,
        "user_id": user_id,
        "flow_id": flow_id,
        "execution_id": execution_id,
        "step_id": step_id,
        "component_id": component_id,
        "data": data,
    }


def _stored(e: Mapping[str, Any]) -> Mapping[str, Any]:
    """The row as stored: the user owner only on an entry of no tenant (its only reader is a
    tenantless caller's scope, ``iam.visibility.tenant_data_clause``). (A NUL character in the
    message is stored as U+FFFD by its type, ``db.base.QuotedText``.)"""
    if e.get("tenant") is not None and e.get("user_id") is not None:
        return {**e, "user_id": None}
    return e


async def append(session: AsyncSession, entries: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``entries`` (dicts of the ``logs`` columns, as :func:`entry` or the runner's
    outcomes make them) in the caller's transaction: one statement however many."""
    if entries:
        await insert_into(_LOGS, tuple(entries[0])).many(session, [_stored(e) for e in entries])


async def append_one(session: AsyncSession, level: str, message: str, **fields: Any) -> None:
    """One entry: ``fields`` are :func:`entry`'s keywords."""
    await append(session, [entry(level, message, **fields)])
