"""The flow's status: its states, the moves allowed between them, and the one function that
moves it. Every write of ``flows.status`` goes through :func:`move` (a new flow is born
``inactive``); everything else only reads the status, comparing with :class:`FlowStatus`.

    inactive --start--> starting --runnable--> active --stop--> stopping --drained--> inactive
                          |                                                             ^
                          +---- cannot run / bound passed ------------------------------+

SPEC §3: ``start`` and ``stop`` are the API's (``flows/service.py``), the other moves the
lifecycle reconciler's (``triggers/lifecycle.py``), which also forces a flow stuck in
``starting`` or ``stopping`` past the bound to ``inactive``. Each move is one conditional
``UPDATE ... WHERE status = <from>``: of concurrent movers exactly one wins.

A move also moves the flow in the list counts (``flows.counts``), in the same transaction.

Imports: the flow model and counts, ``flowyard.states`` and SQLAlchemy only.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.flows import counts
from flowyard.flows.models import Flow
from flowyard.states import IllegalMove, Machine

__all__ = ["IN_TRANSIT", "MOVES", "TRIGGERED", "FlowStatus", "IllegalMove", "check", "move"]


class FlowStatus(StrEnum):
    """The stored values stay these strings (``flows.status``, the API's ``status``)."""

    INACTIVE = "inactive"
    STARTING = "starting"
    ACTIVE = "active"
    STOPPING = "stopping"


# Every allowed move and who makes it; any other (from, to) pair is refused.
MOVES: dict[tuple[FlowStatus, FlowStatus], str] = {
    (FlowStatus.INACTIVE, FlowStatus.STARTING): "POST /flows/{id}/start",
    (FlowStatus.ACTIVE, FlowStatus.STOPPING): "POST /flows/{id}/stop",
    (FlowStatus.STARTING, FlowStatus.ACTIVE): "the lifecycle: the flow is runnable (and subscribed)",
    (FlowStatus.STARTING, FlowStatus.INACTIVE): "the lifecycle: the flow cannot run, or the bound passed",
    (FlowStatus.STOPPING, FlowStatus.INACTIVE): "the lifecycle: drained, grace over, or the bound passed",
}

# The states in which a flow's triggers are wanted (an event trigger subscribes in ``starting``).
TRIGGERED = (FlowStatus.STARTING, FlowStatus.ACTIVE)
IN_TRANSIT = (FlowStatus.STARTING, FlowStatus.STOPPING)


# check(frm, to): ``to`` if the move is allowed, else IllegalMove.
check = Machine(FlowStatus, MOVES).check


_KEEP: Any = object()


async def move(
    session: AsyncSession,
    flow_id: str,
    frm: FlowStatus,
    to: FlowStatus,
    *,
    at: datetime,
    message: str | None = None,
    next_run_at: datetime | None = _KEEP,
) -> bool:
    """Move one flow from ``frm`` to ``to`` in the caller's transaction; True if it moved, False
    if it was not in ``frm`` (another process moved it first, or it is gone). ``message`` becomes
    the ``statusMessage`` (None clears it); ``next_run_at`` is left as it is unless given.
    Raises :class:`IllegalMove` for a move outside :data:`MOVES`, before touching the row."""
    check(frm, to)
    values: dict[str, Any] = {"status": to, "status_changed_at": at, "status_message": message}
    if next_run_at is not _KEEP:
        values["next_run_at"] = next_run_at
    kind = await session.scalar(
        sa.update(Flow)
        .where(Flow.id == flow_id, Flow.status == frm)
        .values(**values)
        .returning(Flow.type)
        .execution_options(synchronize_session=False)
    )
    if kind is None:
        return False
    owners = await counts.owner_entries(session, flow_id)
    await counts.shift(
        session, before=[counts.Shape(owners, frm, kind)], after=[counts.Shape(owners, to, kind)]
    )
    return True
