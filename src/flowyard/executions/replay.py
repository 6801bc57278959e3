"""Replay and cancel (SPEC §11): ``POST /executions/{id}/retry``, ``/rerun`` and ``/cancel``.
No HTTP here.

Who may (SPEC §2), decided here and nowhere else: ``tenant.flows.update`` (else 403), on an
execution the caller can read (``executions.service.visible_clause``; else 404, whether it
exists or not). The state conflicts answer 409:

- retry: the execution is ``failed`` or ``cancelled``; its flow exists and is active; the step
  it failed at is still in the flow. It starts at that step with the message the step failed
  on, the results of the other steps carried over (``queue/continuation.py``),
  not run again. An execution that failed before any step failed (its runner died too often,
  its flow could not be prepared) or was cancelled before a step failed starts from its
  trigger data.
- rerun: the execution has finished; its flow exists and is active. It starts from the
  original trigger data on the flow's current version.
- cancel: the execution is ``queued``, ``waiting`` or ``running``.

A replay is queued like any execution: counted for its flow, shared fairly and held to the
per-tenant cap (``FLOWYARD_MAX_RUNNING_PER_TENANT``) when it is claimed.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import undefer

from flowyard import ids
from flowyard.clock import utcnow
from flowyard.errors import Conflict, NotFound
from flowyard.executions.service import steps_of, visible_clause
from flowyard.flows.models import Flow
from flowyard.flows.status import FlowStatus
from flowyard.iam import permissions as perms
from flowyard.iam.principal import Principal
from flowyard.ids import new_id
from flowyard.queue import continuation
from flowyard.queue import store as queue
from flowyard.queue.models import Execution
from flowyard.queue.status import FINISHED, ExecutionStatus

RETRYABLE = (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)
CANCELLABLE = (ExecutionStatus.QUEUED, ExecutionStatus.WAITING, ExecutionStatus.RUNNING)


async def _writable(session: AsyncSession, principal: Principal, execution_id: str) -> Execution:
    """The execution, if the caller may replay or cancel it: 403 without
    ``tenant.flows.update``, 404 when it does not exist or the caller cannot read it."""
    principal.require(perms.FLOWS_UPDATE)
    ids.check_id(execution_id, "execution")
    e = await session.scalar(
        sa.select(Execution)
        .options(undefer(Execution.steps))
        .where(Execution.id == execution_id, visible_clause(principal))
    )
    if e is None:
        raise NotFound(f"Execution {execution_id} not found.")
    return e


async def _active_flow(session: AsyncSession, e: Execution) -> Flow:
    flow = await session.scalar(sa.select(Flow).where(Flow.id == e.flow_id))
    if flow is None:
        raise Conflict(f"The flow of execution {e.id} no longer exists.")
    if flow.status != FlowStatus.ACTIVE:
        raise Conflict(f"Flow is not active. Current status: {flow.status}")
    return flow


async def _queue(
    session: AsyncSession,
    flow: Flow,
    source: Execution,
    *,
    state: Any = None,
    retry_of: str | None = None,
    rerun_of: str | None = None,
) -> Execution:
    eid = new_id()
    await queue.enqueue(
        session,
        [
            queue.NewExecution(
                id=eid,
                flow_id=flow.id,
                flow_version=flow.version,
                flow_name=flow.name,
                tenant=flow.tenant,
                owner_user=queue.owner_user_of(flow.owners),
                trigger=source.trigger,
                input=source.input,
                created_at=utcnow(),
                state=state,
                parent_execution_id=source.parent_execution_id,
                retry_of=retry_of,
                rerun_of=rerun_of,
            )
        ],
    )
    new = await session.scalar(sa.select(Execution).where(Execution.id == eid))
    assert new is not None
    return new


def _failed_step(e: Execution) -> dict[str, Any] | None:
    """The step the execution failed at, with the message it failed on (None: no step failed,
    or it was recorded before steps kept their input). A step whose failure a failure edge took
    keeps its input too (the step debugger shows it): the one the execution's error names wins."""
    failed = [
        step
        for step in steps_of(e)
        if isinstance(step, dict) and step.get("status") == "failed" and isinstance(step.get("input"), dict)
    ]
    for step in failed:
        if (e.error or "").startswith(f"step {step.get('nodeId')} failed:"):
            return step
    return failed[0] if failed else None


async def retry(session: AsyncSession, principal: Principal, execution_id: str) -> Execution:
    """A new execution (``retryOf``) that goes on at the step ``execution_id`` failed at."""
    source = await _writable(session, principal, execution_id)
    if source.status not in RETRYABLE:
        raise Conflict(
            f"Only a failed or cancelled execution can be retried; execution {source.id} is {source.status}."
        )
    flow = await _active_flow(session, source)
    failed = _failed_step(source)
    state = None
    if failed is not None:
        node = failed["nodeId"]
        if node not in {n.get("id") for n in (flow.graph or {}).get("nodes", []) if isinstance(n, dict)}:
            raise Conflict(
                f"Step {node} is no longer in flow {flow.id}; "
                "re-run the execution from its trigger data instead."
            )
        # Every other step's record (those that succeeded, and one that failed into a failure
        # edge) is carried over; the failed step runs again.
        carried = [s for s in steps_of(source) if isinstance(s, dict) and s.get("nodeId") != node]
        state = continuation.start_at(node, failed["input"], carried)
    return await _queue(session, flow, source, state=state, retry_of=source.id)


async def rerun(session: AsyncSession, principal: Principal, execution_id: str) -> Execution:
    """A new execution (``rerunOf``) of the flow's current version with the original trigger data."""
    source = await _writable(session, principal, execution_id)
    if source.status not in FINISHED:
        raise Conflict(
            f"Execution {source.id} is {source.status}; only a finished execution can be re-run "
            "(cancel it first)."
        )
    flow = await _active_flow(session, source)
    return await _queue(session, flow, source, rerun_of=source.id)


async def cancel(session: AsyncSession, principal: Principal, execution_id: str) -> Execution:
    """Cancel a queued, waiting or running execution; a running step is interrupted by the
    worker that runs it when it next renews its leases."""
    e = await _writable(session, principal, execution_id)
    if e.status not in CANCELLABLE:
        raise Conflict(
            f"Only a queued, waiting or running execution can be cancelled; execution {e.id} is {e.status}."
        )
    was = await queue.cancel(session, e.id, f"cancelled on request of user {principal.username}")
    if was is None:
        raise Conflict(f"Execution {e.id} finished meanwhile.")
    await session.refresh(e)
    return e
