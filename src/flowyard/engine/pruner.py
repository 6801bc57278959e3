"""Retention: old executions, steps and logs are deleted in small batches (so
no transaction holds SQLite's write lock for long and the WAL stays small);
the per-day counters are never touched, so counts survive pruning."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.executions.models import IDEMPOTENCY_WINDOW, Execution, IdempotencyKey
from flowyard.logs.models import LogEntry
from flowyard.webhooks.models import WebhookRateBucket

log = logging.getLogger(__name__)

RATE_BUCKET_IDLE = timedelta(days=1)


def _id_floor(when: datetime) -> str:
    """The smallest object id created at ``when``: ids start with their creation second."""
    return int(when.timestamp()).to_bytes(4, "big").hex() + "0" * 16


async def prune(
    db: Database, *, retention: timedelta, batch: int, now: datetime | None = None
) -> dict[str, int]:
    now = now or utcnow()
    cutoff = _id_floor(now - retention)
    counts = {"executions": 0, "logs": 0, "idempotency_keys": 0, "webhook_rate_buckets": 0}
    while True:
        async with db.write() as session:
            ids = list(
                (
                    await session.scalars(
                        sa.select(Execution.id)
                        .where(
                            Execution.id < cutoff, Execution.status.in_(("succeeded", "failed", "cancelled"))
                        )
                        .order_by(Execution.id)
                        .limit(batch)
                    )
                ).all()
            )
            if ids:
                await session.execute(sa.delete(Execution).where(Execution.id.in_(ids)))
        counts["executions"] += len(ids)
        if len(ids) < batch:
            break
    while True:
        async with db.write() as session:
            log_ids = list(
                (
                    await session.scalars(
                        sa.select(LogEntry.id)
                        .where(LogEntry.timestamp < now - retention)
                        .order_by(LogEntry.id)
                        .limit(batch)
                    )
                ).all()
            )
            if log_ids:
                await session.execute(sa.delete(LogEntry).where(LogEntry.id.in_(log_ids)))
        counts["logs"] += len(log_ids)
        if len(log_ids) < batch:
            break
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
        async with db.engine.connect() as conn:
            # Return the WAL's pages to the main file so it does not grow without bound.
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
    return counts
