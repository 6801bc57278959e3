"""Event triggers: the component API and the lease that makes one process consume per flow.

A trigger component lists, in ``Component.events``, functions
``events(ctx: TriggerContext) -> AsyncIterator[Event]``. The engine
(``triggers/consumers.py``) drives the iterator while it holds the flow's lease:
the connector connects (through the outbound policy), subscribes, calls
``await ctx.subscribed()`` and then yields one ``Event`` per broker message.
The engine stores the execution row (idempotency key ``<component>:<event id>``)
and only after that commit awaits ``event.ack()``. Closing the iterator
(``aclose()``) unsubscribes. An iterator that raises (connection lost) is
started again with back-off by the engine.

The ``trigger_leases`` rows are written here only: ``ensure`` (lifecycle, when
a flow starts), ``take``/``renew``/``mark``/``release`` (the holder), ``drop``
(lifecycle, when the flow becomes inactive), ``heartbeat.free_trigger_leases`` (the engine that saw
a holder's heartbeat stop, in the transaction that deletes that heartbeat).

A lease's holder is the id of its engine process's heartbeat row
(``queue/heartbeat.py``, ``Worker.id``): a SIGKILLed holder's leases are freed
as soon as another engine sees its heartbeat stop, not a lease period later;
the expiry stays as the backstop.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.components.events import Event, TriggerContext, TriggerFunction
from flowyard.components.registry import TriggerNode, TriggerProblem, trigger_node
from flowyard.db.dialect import insert_ignore
from flowyard.queue.trigger_lease import TriggerLease

# Their home is components/ (events.py, registry.py: the flows service asks for the trigger too).
__all__ = ["Event", "TriggerContext", "TriggerFunction", "TriggerNode", "TriggerProblem", "trigger_node"]


_MAX_KEY = 255


def idempotency_key(component: str, event_id: str) -> str:
    key = f"{component}:{event_id}"
    if len(key) <= _MAX_KEY:
        return key
    return f"{component}:sha256:{hashlib.sha256(event_id.encode()).hexdigest()}"


async def ensure(session: AsyncSession, flow_id: str, version: int) -> TriggerLease:
    await session.execute(
        insert_ignore(session, TriggerLease, ["flow_id"]).values(flow_id=flow_id, flow_version=version)
    )
    lease = await session.get(TriggerLease, flow_id, populate_existing=True)
    assert lease is not None
    return lease


def alive(lease: TriggerLease, now: datetime) -> bool:
    return lease.holder is not None and lease.expires_at is not None and lease.expires_at > now


async def drop(session: AsyncSession, flow_id: str) -> None:
    await session.execute(sa.delete(TriggerLease).where(TriggerLease.flow_id == flow_id))


async def take(session: AsyncSession, flow_id: str, holder: str, now: datetime, seconds: float) -> bool:
    """Take a free or expired lease (a conditional UPDATE: one taker wins)."""
    result = await session.execute(
        sa.update(TriggerLease)
        .where(
            TriggerLease.flow_id == flow_id,
            sa.or_(
                TriggerLease.holder.is_(None),
                TriggerLease.expires_at.is_(None),
                TriggerLease.expires_at <= now,
            ),
        )
        .values(holder=holder, expires_at=now + timedelta(seconds=seconds), subscribed_at=None)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0) == 1  # type: ignore[attr-defined]


async def renew(
    session: AsyncSession, holder: str, flow_ids: list[str], now: datetime, seconds: float
) -> set[str]:
    """Extend this holder's leases; returns the flows whose lease it still holds."""
    if not flow_ids:
        return set()
    await session.execute(
        sa.update(TriggerLease)
        .where(TriggerLease.flow_id.in_(flow_ids), TriggerLease.holder == holder)
        .values(expires_at=now + timedelta(seconds=seconds))
        .execution_options(synchronize_session=False)
    )
    rows = await session.scalars(
        sa.select(TriggerLease.flow_id).where(
            TriggerLease.flow_id.in_(flow_ids), TriggerLease.holder == holder
        )
    )
    return set(rows.all())


async def mark(
    session: AsyncSession, flow_id: str, holder: str, *, subscribed_at: datetime | None, problem: str | None
) -> bool:
    result = await session.execute(
        sa.update(TriggerLease)
        .where(TriggerLease.flow_id == flow_id, TriggerLease.holder == holder)
        .values(subscribed_at=subscribed_at, problem=problem)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0) == 1  # type: ignore[attr-defined]


async def release(session: AsyncSession, flow_id: str, holder: str, *, delete: bool) -> None:
    """The holder unsubscribed: delete the lease (the flow is stopping) or free it for another
    process (this one is shutting down)."""
    where = sa.and_(TriggerLease.flow_id == flow_id, TriggerLease.holder == holder)
    if delete:
        await session.execute(sa.delete(TriggerLease).where(where))
    else:
        await session.execute(
            sa.update(TriggerLease)
            .where(where)
            .values(holder=None, expires_at=None, subscribed_at=None)
            .execution_options(synchronize_session=False)
        )
