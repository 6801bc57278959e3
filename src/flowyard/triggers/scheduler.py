"""The cron scheduler. Any number may run (one per engine process): a tick is
claimed by a compare-and-set on ``flows.next_run_at`` and inserted under the
unique key (flow, scheduled time), so each tick makes exactly one execution.

After downtime the missed ticks of a flow produce one catch-up run, not a
burst: the next tick is computed from *now*, not from the missed one.
"""

from __future__ import annotations

import logging
from datetime import datetime

import sqlalchemy as sa

from flowyard import metrics
from flowyard.clock import isoformat, utcnow
from flowyard.components.cron import next_after
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from flowyard.flows.status import FlowStatus
from flowyard.ids import new_id
from flowyard.logs.append import append_one
from flowyard.queue import store as queue

log = logging.getLogger(__name__)


async def due_flows(db: Database, now: datetime, limit: int = 500) -> list[tuple[str, datetime]]:
    async with db.read() as session:
        rows = (
            await session.execute(
                sa.select(Flow.id, Flow.next_run_at)
                # By next_run_at alone (its index): _fire re-checks status and cron under the CAS.
                .where(Flow.next_run_at <= now)
                .order_by(Flow.next_run_at)
                .limit(limit)
            )
        ).all()
    return [(r[0], r[1]) for r in rows if r[1] is not None]


async def next_due(db: Database) -> datetime | None:
    async with db.read() as session:
        # Only active cron flows have a next_run_at, so the index alone answers this
        # (filtering on status would lead the planner to read every active flow).
        return await session.scalar(
            sa.select(Flow.next_run_at)
            .where(Flow.next_run_at.is_not(None))
            .order_by(Flow.next_run_at)
            .limit(1)
        )


async def fire_due(db: Database, *, overlap: str) -> list[str]:
    """Fire every due tick once; returns the ids of the executions created here."""
    now = utcnow()
    created: list[str] = []
    for flow_id, tick in await due_flows(db, now):
        try:
            eid = await _fire(db, flow_id, tick, now, overlap)
        except Exception:
            log.exception("firing tick %s of flow %s failed", tick, flow_id)
            continue
        if eid:
            created.append(eid)
    return created


async def _fire(db: Database, flow_id: str, tick: datetime, now: datetime, overlap: str) -> str | None:
    async with db.write() as session:
        flow = await session.get(Flow, flow_id)
        if flow is None or flow.status != FlowStatus.ACTIVE or not flow.cron or flow.next_run_at != tick:
            return None  # another scheduler claimed it, or the flow changed
        following = next_after(flow.cron, now)
        claimed = await session.execute(
            sa.update(Flow)
            .where(Flow.id == flow_id, Flow.next_run_at == tick, Flow.status == FlowStatus.ACTIVE)
            .values(next_run_at=following)
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            return None
        owner = queue.owner_user_of(flow.owners)
        if overlap == "skip" and await queue.unfinished_count(session, flow_id):
            await append_one(
                session,
                "warn",
                f"tick {isoformat(tick)} skipped: the previous run of the flow has not finished",
                timestamp=now,
                tenant=flow.tenant,
                user_id=owner,
                flow_id=flow_id,
            )
            metrics.cron_tick(fired=False)
            return None
        eid = new_id()
        ids = await queue.enqueue(
            session,
            [
                queue.NewExecution(
                    id=eid,
                    flow_id=flow_id,
                    flow_version=flow.version,
                    flow_name=flow.name,
                    tenant=flow.tenant,
                    owner_user=owner,
                    trigger="cron",
                    created_at=now,
                    scheduled_for=tick,
                    input={"scheduledFor": isoformat(tick), "firedAt": isoformat(now)},
                )
            ],
            skip_duplicates=True,
        )
    if ids:
        metrics.cron_tick(fired=True)  # committed
    return ids[0] if ids else None
