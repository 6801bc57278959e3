"""Sub-flows (SPEC §12): the ``flow`` step's child executions, started and answered by the queue.

A ``flow`` step parks its execution (runtime/runner.py) with a ``call`` on the first pending
entry of its continuation. When the queue records that park (``complete``), in the same
transaction, :func:`start_children` checks the call again (the flow named exists, is in the
parent's tenant and shares an owner with the parent's flow, and the depth is within
FLOWYARD_FLOW_MAX_DEPTH) and enqueues the child (trigger ``flow``, ``parentExecutionId`` the
parent, the message data as input), noting its id on the entry; or writes why it could not on the
entry and makes the parent due at once, so the step fails with that reason. When a child
finishes, :func:`wake_parents` (in the transaction that records it) writes its outcome onto its
parent's entry and makes the parent due now; the resumer queues it and the step goes on. A
parent whose child never answers (cancelled, abandoned) resumes at the step's ``timeout`` and
fails there. Nothing is held while the parent waits: it is an ordinary ``waiting`` execution.

A refusal never says more than the flow's id: a flow that does not exist, one of another tenant
and one the owners cannot see read the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import utcnow
from flowyard.components.builtins import flow_refusal
from flowyard.db.dialect import dialect_name
from flowyard.db.prepared import Prepared
from flowyard.flows.models import Flow
from flowyard.iam.visibility import owner_user_of, shares_owner
from flowyard.ids import is_valid_id, new_id
from flowyard.queue.models import Execution
from flowyard.queue.records import Outcome
from flowyard.queue.status import ExecutionStatus

FLOW_TRIGGER = "flow"  # the trigger (and metadata.source) of a sub-flow's execution
_EXECUTIONS = cast(sa.Table, Execution.__table__)


def _call_of(o: Outcome) -> dict[str, Any] | None:
    """The first pending entry of a parked outcome when it is a call not started yet."""
    state = o.state if isinstance(o.state, dict) else None
    pending = (state or {}).get("pending") or []
    first = pending[0] if pending and isinstance(pending[0], dict) else None
    if first is None or not isinstance(first.get("call"), dict):
        return None
    # A runner's park never names a child yet; one named here by a transaction that was rolled
    # back (the worker records the batch again) is forgotten, and the child made again.
    first.pop("childId", None)
    first.pop("child", None)
    return first


def _owners(text: str | None) -> list[dict[str, str]]:
    try:
        value = orjson.loads(text) if text is not None else None
    except orjson.JSONDecodeError:
        return []
    if not isinstance(value, list):
        return []
    return [o for o in value if isinstance(o, dict) and isinstance(o.get("id"), str)]


async def _chain(session: AsyncSession, execution_id: str, limit: int) -> list[str]:
    """The flow ids from the outermost caller down to ``execution_id``'s flow (at most
    ``limit`` + 1 of them: enough to tell the depth is over the limit)."""
    chain: list[str] = []
    current: str | None = execution_id
    while current is not None and len(chain) <= limit:
        row = (
            await session.execute(
                sa.select(Execution.flow_id, Execution.trigger, Execution.parent_execution_id).where(
                    Execution.id == current
                )
            )
        ).first()
        if row is None:
            break
        chain.insert(0, row.flow_id)
        current = row.parent_execution_id if row.trigger == FLOW_TRIGGER else None
    return chain


async def children_of(
    session: AsyncSession, parked: Sequence[Outcome], *, max_depth: int
) -> list[dict[str, Any]]:
    """The child each parked outcome that calls a flow starts, as ``NewExecution`` keywords
    (``queue.store.complete`` enqueues them in its transaction, before it writes the park: the
    outcome's state and ``resume_at`` are updated here)."""
    calls = [(o, first) for o in parked if (first := _call_of(o)) is not None]
    if not calls:
        return []
    wanted = {str(first["call"].get("flowId")) for _o, first in calls}
    parents = {o.flow_id for o, _first in calls}
    rows = {
        r.id: r
        for r in (
            await session.execute(
                sa.select(
                    Flow.id,
                    Flow.version,
                    Flow.name,
                    Flow.tenant,
                    sa.cast(Flow.owners, sa.Text).label("owners"),
                ).where(Flow.id.in_({w for w in wanted if is_valid_id(w)} | parents))
            )
        ).all()
    }
    now = utcnow()
    items: list[dict[str, Any]] = []
    for o, first in calls:
        target_id = str(first["call"].get("flowId"))
        parent, target = rows.get(o.flow_id), rows.get(target_id)
        why = None
        if (
            parent is None
            or target is None
            or target.tenant != parent.tenant
            or not shares_owner(_owners(parent.owners), _owners(target.owners))
        ):
            why = flow_refusal(target_id)
        else:
            chain = await _chain(session, o.execution_id, max_depth)
            if len(chain) > max_depth:  # the child would be nested deeper than the limit
                why = (
                    f"the sub-flow depth limit ({max_depth}, FLOWYARD_FLOW_MAX_DEPTH) is reached: "
                    + " → ".join([*chain, target_id])
                )
        if why is not None or target is None:
            first["child"] = {"error": why}
            o.resume_at = now  # due at once: the step fails with why
            continue
        child_id = new_id()
        first["childId"] = child_id
        data = first.get("message", {}).get("data") if isinstance(first.get("message"), dict) else None
        items.append(
            {
                "id": child_id,
                "flow_id": target.id,
                "flow_version": target.version,
                "flow_name": target.name,
                "tenant": target.tenant,
                "owner_user": owner_user_of(_owners(target.owners)),
                "trigger": FLOW_TRIGGER,
                "input": data,
                "created_at": now,
                "parent_execution_id": o.execution_id,
            }
        )
    return items


Ended = tuple[str, str, Any, str | None]
"""An execution that reached a final state: (id, status, result, error)."""


# Of the given executions, the sub-flow children and their parents.
_CHILDREN = Prepared(
    sa.select(Execution.id, Execution.parent_execution_id).where(
        Execution.id.in_(sa.bindparam("ids", expanding=True)),
        Execution.trigger == FLOW_TRIGGER,
        Execution.parent_execution_id.is_not(None),
    )
)


class _Child(NamedTuple):
    id: str
    parent_execution_id: str


async def wake_parents(session: AsyncSession, ended: Sequence[Ended]) -> list[str]:
    """Hand each ended child's outcome to its waiting parent and make the parent due now (in
    the caller's transaction, after the children's rows were written: an outcome recorded, a
    cancel, a stop, an abandoned or unreadable execution failed); returns the parents' ids. A
    parent no longer waiting for that child (it timed out, was cancelled) is left alone."""
    if not ended:
        return []
    by_id = {e[0]: e for e in ended}
    children = [_Child(*r) for r in await _CHILDREN.all(session, {"ids": list(by_id)})]
    if not children:
        return []
    find = sa.select(Execution.id, sa.cast(Execution.state, sa.Text).label("state")).where(
        Execution.id.in_({c.parent_execution_id for c in children}),
        Execution.status == ExecutionStatus.WAITING,
    )
    if dialect_name(session) == "postgresql":
        # Locked until this commits, so the state read here is the one replaced (a resumer skips
        # the row meanwhile). SQLite: this write transaction is the only writer.
        find = find.with_for_update()
    parents = {r.id: r.state for r in (await session.execute(find)).all()}
    now = utcnow()
    woken: list[str] = []
    for child in children:
        text = parents.get(child.parent_execution_id)
        try:
            state = orjson.loads(text) if text is not None else None
        except orjson.JSONDecodeError:
            state = None
        pending = state.get("pending") if isinstance(state, dict) else None
        first = pending[0] if isinstance(pending, list) and pending and isinstance(pending[0], dict) else None
        if first is None or first.get("childId") != child.id:
            continue
        _id, status, result, error = by_id[child.id]
        first["child"] = {"id": child.id, "status": str(status), "result": result, "error": error}
        moved = await session.execute(
            sa.update(_EXECUTIONS)
            .where(
                _EXECUTIONS.c.id == child.parent_execution_id, _EXECUTIONS.c.status == ExecutionStatus.WAITING
            )
            .values(state=state, resume_at=now)
        )
        if moved.rowcount:  # type: ignore[attr-defined]
            woken.append(child.parent_execution_id)
    return woken
