"""Flow versions (SPEC §12): the one writer of ``flow_versions`` and of
``flows.history_version``. A version is the flow's runnable content (``graph``, ``cron``,
``errorFlowId``); a change of anything else (name, description, owners, ...) makes none.
Permissions are decided by the caller (flows/service.py); nothing here checks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import isoformat
from flowyard.flows.models import Flow, FlowVersion

# The flow's attributes a version holds, and the served names.
VERSIONED = (("graph", "graph"), ("cron", "cron"), ("error_flow_id", "errorFlowId"))


def content(flow: Flow | FlowVersion | Any) -> dict[str, Any]:
    """The versioned content of a flow row (or of a version), by attribute name."""
    return {attr: getattr(flow, attr, None) for attr, _served in VERSIONED}


def changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return any(before.get(attr) != after.get(attr) for attr, _served in VERSIONED)


async def record_first(session: AsyncSession, flows: Sequence[Flow]) -> None:
    """Version 1 of new flows (their ``history_version`` is 1 already), by their creators."""
    if flows:
        await session.execute(
            sa.insert(FlowVersion),
            [
                {
                    "flow_id": f.id,
                    "number": 1,
                    **content(f),
                    "author": f.created_by,
                    "created_at": f.created_at,
                }
                for f in flows
            ],
        )


async def record(
    session: AsyncSession,
    flow_id: str,
    number: int,
    new: dict[str, Any],
    *,
    author: str | None,
    at: datetime,
    restored_from: int | None = None,
) -> None:
    """Version ``number`` of a flow whose row was just given content ``new`` and
    ``history_version = number`` in the caller's transaction (under its compare-and-set)."""
    await session.execute(
        sa.insert(FlowVersion).values(
            flow_id=flow_id,
            number=number,
            **{attr: new.get(attr) for attr, _served in VERSIONED},
            author=author,
            restored_from=restored_from,
            created_at=at,
        )
    )


async def forget(session: AsyncSession, flow_id: str) -> None:
    """A deleted flow's versions go with it."""
    await session.execute(sa.delete(FlowVersion).where(FlowVersion.flow_id == flow_id))


async def page(
    session: AsyncSession, flow_id: str, *, limit: int, offset: int
) -> tuple[Sequence[FlowVersion], int]:
    """A page of a flow's versions, newest first."""
    total = (
        await session.scalar(
            sa.select(sa.func.count()).select_from(FlowVersion).where(FlowVersion.flow_id == flow_id)
        )
        or 0
    )
    if total == 0 or offset >= total:
        return [], total
    rows = await session.scalars(
        sa.select(FlowVersion)
        .where(FlowVersion.flow_id == flow_id)
        .order_by(FlowVersion.number.desc())
        .limit(limit)
        .offset(offset)
    )
    return rows.all(), total


async def get(session: AsyncSession, flow_id: str, number: int) -> FlowVersion | None:
    return await session.scalar(
        sa.select(FlowVersion).where(FlowVersion.flow_id == flow_id, FlowVersion.number == number)
    )


def to_dict(v: FlowVersion, *, current: int, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "flowId": v.flow_id,
        "version": v.number,
        "author": v.author,
        "createdAt": isoformat(v.created_at),
        "restoredFrom": v.restored_from,
        "current": v.number == current,
    }
    if full:
        for attr, served in VERSIONED:
            out[served] = getattr(v, attr)
    return out
