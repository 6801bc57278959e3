"""Retention: old executions, steps and logs are deleted in small batches (so
no transaction holds SQLite's write lock for long and the WAL stays small);
the per-day counters are never touched, so counts survive pruning."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from flowyard import isolate, metrics
from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.logs.models import LogEntry
from flowyard.queue.models import IDEMPOTENCY_WINDOW, Execution, IdempotencyKey
from flowyard.queue.rate_buckets import WebhookRateBucket

log = logging.getLogger(__name__)

RATE_BUCKET_IDLE = timedelta(days=1)
_VACUUM_PAGES = 2048  # 8 MiB of 4 KiB pages per transaction


def _id_floor(when: datetime) -> str:
    """The smallest object id created at ``when``: ids start with their creation second."""
    return int(when.timestamp()).to_bytes(4, "big").hex() + "0" * 16


async def prune(
    db: Database, *, retention: timedelta, batch: int, now: datetime | None = None
) -> dict[str, int]:
    now = now or utcnow()
    cutoff = _id_floor(now - retention)
    counts = {
        "executions": 0,
        "logs": 0,
        "idempotency_keys": 0,
        "webhook_rate_buckets": 0,
        "pages_given_back": 0,
    }
    counts["executions"] = await _delete_in_batches(
        db,
        "execution",
        sa.select(Execution.id).where(
            Execution.id < cutoff, Execution.status.in_(("succeeded", "failed", "cancelled"))
        ),
        Execution.id,
        batch,
    )
    counts["logs"] = await _delete_in_batches(
        db,
        "log entry",
        sa.select(LogEntry.id).where(LogEntry.timestamp < now - retention),
        LogEntry.id,
        batch,
    )
    async with db.write() as session:
        result = await session.execute(
            sa.delete(IdempotencyKey).where(IdempotencyKey.created_at < now - IDEMPOTENCY_WINDOW)
        )
        counts["idempotency_keys"] = int(result.rowcount or 0)  # type: ignore[attr-defined]
        # A bucket idle this long has refilled: dropping it is the same as keeping it full.
        result = await session.execute(
            sa.delete(WebhookRateBucket).where(
                WebhookRateBucket.refilled_at < (now - RATE_BUCKET_IDLE).timestamp()
            )
        )
        counts["webhook_rate_buckets"] = int(result.rowcount or 0)  # type: ignore[attr-defined]
    if db.is_sqlite and (counts["executions"] or counts["logs"]):
        # Hand the freed pages back to the file system, a few MiB per short transaction so
        # the other writers take turns (a file made in incremental auto-vacuum mode).
        while True:
            given = await db.give_back_space(_VACUUM_PAGES)
            counts["pages_given_back"] += given
            if given < _VACUUM_PAGES:
                break
        async with db.engine.connect() as conn:
            # Return the WAL's pages to the main file so it does not grow without bound.
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
    return counts


async def _delete_in_batches(db: Database, what: str, select: sa.Select[Any], column: Any, batch: int) -> int:
    """Delete the rows ``select`` finds, ``batch`` at a time in id order, one short transaction
    each. A row whose deletion fails is skipped with a log line and the rest is deleted
    (``isolate.py``); the next pass tries it again."""
    deleted = 0
    after: Any = None
    while True:
        query = select.order_by(column).limit(batch)
        if after is not None:
            query = query.where(column > after)
        async with db.read() as session:
            ids = list((await session.scalars(query)).all())
        if not ids:
            break
        after = ids[-1]

        async def delete(part: Sequence[Any]) -> None:
            nonlocal deleted
            async with db.write() as session:
                await session.execute(sa.delete(column.class_).where(column.in_(list(part))))
            deleted += len(part)

        async def skip(row_id: Any, exc: BaseException) -> None:
            log.error(
                "pruning: %s %s could not be deleted and is skipped: %s", what, row_id, isolate.reason(exc)
            )
            metrics.poison("prune")

        left = await isolate.bisect(ids, delete, skip)
        if left.error is not None:
            raise left.error
        if len(ids) < batch:
            break
    return deleted
