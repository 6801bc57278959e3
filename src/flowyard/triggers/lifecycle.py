"""The lifecycle reconciler: completes ``starting`` → ``active`` and
``stopping`` → ``inactive``. State lives only in the database, so whichever
engine process runs next picks up a move a dead process left half done, and no
flow stays in transit longer than the configured bound."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import metrics
from flowyard.clock import utcnow
from flowyard.components.cron import CronError, next_after, validate_cron
from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.flows import status as flow_status
from flowyard.flows.models import Flow
from flowyard.flows.status import FlowStatus
from flowyard.logs.append import append_one
from flowyard.queue import store as queue
from flowyard.queue.trigger_lease import TriggerLease
from flowyard.runtime.runner import CompiledFlow, FlowNotRunnable
from flowyard.secrets import service as secrets
from flowyard.secrets.crypto import SecretBox
from flowyard.triggers import leases as triggers

log = logging.getLogger(__name__)


async def reconcile(
    db: Database, registry: Registry, box: SecretBox, *, stop_grace: float, bound: float
) -> int:
    """One pass over flows in transit; returns how many moved.

    ``bound`` is the promise that no flow stays in transit longer: a move that
    keeps failing past it is forced to ``inactive`` with the reason.
    """
    async with db.read() as session:
        rows = (
            await session.execute(
                sa.select(Flow.id, Flow.status, Flow.status_changed_at)
                .where(Flow.status.in_(flow_status.IN_TRANSIT))
                .order_by(Flow.status_changed_at)
                .limit(500)
            )
        ).all()
    moved = 0
    for flow_id, status, changed_at in rows:
        try:
            if status == FlowStatus.STARTING:
                moved += await _start(db, registry, box, flow_id, bound)
            else:
                moved += await _stop(db, flow_id, min(stop_grace, bound), bound)
        except Exception as exc:
            if utcnow() - changed_at < timedelta(seconds=bound):
                log.exception("lifecycle move of flow %s failed; will retry", flow_id)
                continue
            log.exception("lifecycle move of flow %s failed past %g s; forcing it inactive", flow_id, bound)
            forced = await _force_inactive(db, flow_id, status, f"{status} failed for {bound:g} s: {exc}")
            if forced:
                metrics.lifecycle_fallback()
            moved += forced
    return moved


async def _force_inactive(db: Database, flow_id: str, status: str, reason: str) -> int:
    async with db.write() as session:
        if status == FlowStatus.STOPPING:
            await queue.cancel_unfinished(session, flow_id, f"cancelled: {reason}")
        await triggers.drop(session, flow_id)
        moved = await flow_status.move(
            session,
            flow_id,
            FlowStatus(status),
            FlowStatus.INACTIVE,
            at=utcnow(),
            message=reason[:2000],
            next_run_at=None,
        )
        return int(moved)


async def _start(db: Database, registry: Registry, box: SecretBox, flow_id: str, bound: float) -> int:
    async with db.write() as session:
        flow = await session.get(Flow, flow_id)
        if flow is None or flow.status != FlowStatus.STARTING:
            return 0
        now = utcnow()
        message = None
        next_run = None
        try:
            compiled = CompiledFlow.compile(
                flow_id=flow.id,
                version=flow.version,
                tenant=flow.tenant,
                owner_user=queue.owner_user_of(flow.owners),
                graph=flow.graph,
                registry=registry,
            )
            _found, problems = await secrets.resolve(
                session, box, compiled.credential_ids, tenant=flow.tenant, owner_user=compiled.owner_user
            )
            if problems:
                raise FlowNotRunnable(
                    "; ".join(f"credentials {cid}: {why}" for cid, why in sorted(problems.items()))
                )
            if flow.cron:
                next_run = next_after(validate_cron(flow.cron), now)
            event_trigger = triggers.trigger_node(flow.graph, registry)
        except (FlowNotRunnable, CronError, triggers.TriggerProblem) as exc:
            message = f"Flow cannot run: {exc}"
            event_trigger = None
        if event_trigger is not None and not message:
            # An event trigger: active only once a process holds the lease and is subscribed.
            lease = await triggers.ensure(session, flow.id, flow.version)
            if lease.subscribed_at is None or not triggers.alive(lease, now):
                if now - flow.status_changed_at < timedelta(seconds=bound):
                    return 0
                message = (
                    f"Flow cannot run: the {event_trigger.component.id} {event_trigger.function} trigger "
                    f"did not subscribe within {bound:g} s: {lease.problem or 'no engine took it'}"
                )
        if message:
            await triggers.drop(session, flow.id)
        to = FlowStatus.INACTIVE if message else FlowStatus.ACTIVE
        moved = await flow_status.move(
            session,
            flow_id,
            FlowStatus.STARTING,
            to,
            at=now,
            message=message,
            next_run_at=None if message else next_run,
        )
        if message:
            await _log(session, flow, "error", message, now)
    if moved:
        metrics.lifecycle_move(to)  # committed
    return int(moved)


async def _stop(db: Database, flow_id: str, stop_grace: float, bound: float) -> int:
    async with db.write() as session:
        flow = await session.get(Flow, flow_id)
        if flow is None or flow.status != FlowStatus.STOPPING:
            return 0
        now = utcnow()
        lease = await session.get(TriggerLease, flow_id)
        if lease is not None:
            # Its consumer unsubscribes and deletes the lease first (a dead holder's lease expires).
            if triggers.alive(lease, now) and now - flow.status_changed_at < timedelta(seconds=bound):
                return 0
            await triggers.drop(session, flow_id)
        message = None
        if await queue.unfinished_count(session, flow_id):
            if now - flow.status_changed_at < timedelta(seconds=stop_grace):
                return 0  # still draining
            cancelled = await queue.cancel_unfinished(
                session, flow_id, f"cancelled: the flow was stopped and {stop_grace:g} s of grace ran out"
            )
            message = f"Stopped; {len(cancelled)} unfinished execution(s) cancelled after the grace period."
            await _log(session, flow, "warn", message, now, data={"cancelled": cancelled[:100]})
        moved = await flow_status.move(
            session,
            flow_id,
            FlowStatus.STOPPING,
            FlowStatus.INACTIVE,
            at=now,
            message=message,
            next_run_at=None,
        )
    if moved:
        metrics.lifecycle_move(FlowStatus.INACTIVE)
    return int(moved)


async def _log(
    session: AsyncSession, flow: Flow, level: str, message: str, now: datetime, data: Any = None
) -> None:
    """A log entry about the flow's move (``logs.append``), committed with it."""
    await append_one(
        session,
        level,
        message,
        timestamp=now,
        tenant=flow.tenant,
        user_id=queue.owner_user_of(flow.owners),
        flow_id=flow.id,
        data=data,
    )


async def trigger_status(db: Database, flow_id: str, message: str | None) -> None:
    """An event trigger's connection problem (or None once subscribed again) as the flow's
    ``statusMessage``, while the flow is starting or active."""
    async with db.write() as session:
        await session.execute(
            sa.update(Flow)
            .where(Flow.id == flow_id, Flow.status.in_(flow_status.TRIGGERED))
            .values(status_message=message[:2000] if message else None)
            .execution_options(synchronize_session=False)
        )
