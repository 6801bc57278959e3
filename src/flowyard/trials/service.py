"""Run one step alone on a sample message: the console's "test this step" (SPEC §12).

The step runs where every flow's code runs, in a runner process of the pool, under the same
limits (CPU, memory, wall, network policy, size caps), with the flow's credentials as the
flow would have them; never in this process. A process with an engine uses its engine's
pool (placement keeps tenants apart there as for executions); a process without one
(``serve --no-engine``) starts a small pool of its own on first use. Nothing is stored: no
execution, no count, no log row. The caller needs ``tenant.flows.update`` on the flow.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import isoformat, utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.errors import InvalidInput, Problem, TooManyRequests
from flowyard.flows import service as flows
from flowyard.flows.validation import validate_node
from flowyard.iam import permissions as perms
from flowyard.iam.principal import Principal
from flowyard.iam.visibility import owner_user_of
from flowyard.ids import new_id
from flowyard.queue.records import Claimed, Outcome
from flowyard.queue.store import queue_group_of
from flowyard.runtime.pool import FlowSpec, RunnerPool
from flowyard.runtime.runner import CompiledFlow, FlowNotRunnable
from flowyard.secrets import service as secrets
from flowyard.secrets.crypto import SecretBox

# Components whose step means something only inside an execution.
NOT_ALONE = {
    "delay": "a delay waits inside an execution; there is nothing to test alone",
    "join": "a join waits for messages from several edges of an execution; test the steps before it",
    "flow": "a sub-flow step starts another flow's execution; run the flow itself instead",
}
TRIGGER_ID = "trial-trigger"
PER_GROUP = 2  # trial runs of one tenant (or tenantless owner) at once


async def prepare(
    session: AsyncSession,
    principal: Principal,
    flow_id: str,
    node: Any,
    data: Any,
    *,
    registry: Registry,
    box: SecretBox,
) -> tuple[FlowSpec, Claimed]:
    """Check the caller may change the flow and the node is valid; the spec and the claimed
    execution a runner runs (a trigger handing ``data`` to the node)."""
    principal.require(perms.FLOWS_UPDATE)
    flow = await flows.get_flow(session, principal, flow_id)
    clean, problems = validate_node(node, registry=registry)
    if problems:
        raise InvalidInput(problems)
    component = registry.get(clean["componentId"]) if clean.get("componentId") else None
    if component is None:
        raise InvalidInput([Problem("node.componentId: is required to test a step", "node.componentId")])
    if component.trigger:
        raise InvalidInput(
            [
                Problem(
                    "node.componentId: a trigger has nothing to test; test the step after it",
                    "node.componentId",
                )
            ]
        )
    if component.id in NOT_ALONE:
        raise InvalidInput([Problem(f"node.componentId: {NOT_ALONE[component.id]}", "node.componentId")])
    clean.pop("retry", None)  # one attempt: the editor wants the answer now
    trigger = TRIGGER_ID if clean["id"] != TRIGGER_ID else f"{TRIGGER_ID}-0"
    graph = {
        "nodes": [{"id": trigger, "componentId": "webhook"}, clean],
        "edges": [{"source": trigger, "target": clean["id"]}],
    }
    owner = owner_user_of(flow.owners)
    try:
        compiled = CompiledFlow.compile(
            flow_id=flow.id,
            version=flow.version,
            tenant=flow.tenant,
            owner_user=owner,
            graph=graph,
            registry=registry,
        )
    except FlowNotRunnable as exc:
        raise InvalidInput([Problem(f"node: {exc}", "node")]) from None
    if compiled.credential_ids:
        compiled.credentials, missing = await secrets.resolve(
            session, box, compiled.credential_ids, tenant=flow.tenant, owner_user=owner
        )
        if missing:
            raise InvalidInput(
                [Problem("node.credentials_id: no such secret usable by this flow", "node.credentials_id")]
            )
    claimed = Claimed(
        id=new_id(),
        flow_id=flow.id,
        flow_version=flow.version,
        tenant=flow.tenant,
        owner_user=owner,
        trigger="test",
        input=data if data is not None else {},
        attempts=1,
        created_at=utcnow(),
        scheduled_for=None,
    )
    return FlowSpec.of(compiled, graph), claimed


def outcome_of(outcome: Outcome, node_id: str) -> dict[str, Any]:
    """The tested step's part of the outcome (the trigger's is left out)."""
    step = next((s for s in outcome.steps if s.node_id == node_id), None)
    failed = outcome.status != "succeeded" or (step is not None and step.status == "failed")
    error = (step.error if step is not None else None) or outcome.error
    return {
        "status": "failed" if failed else "succeeded",
        "output": step.output if step is not None else None,
        "messagesOut": step.messages_out if step is not None else 0,
        "error": error if failed else None,
        "durationMs": step.duration_ms if step is not None else 0.0,
        "logs": [
            {
                "timestamp": isoformat(entry["timestamp"]),
                "level": entry["level"],
                "message": entry["message"],
                "data": entry.get("data"),
            }
            for entry in outcome.logs
            if entry.get("step_id") in (None, node_id)
        ],
    }


class Trials:
    """Where trial runs run: the engine's pool, or a small one of this process's own."""

    def __init__(self, settings: Settings, pool: RunnerPool | None) -> None:
        self.settings = settings
        self._engine_pool = pool
        self._own: RunnerPool | None = None
        self._starting = asyncio.Lock()
        self._running: defaultdict[str, int] = defaultdict(int)

    async def _pool(self) -> RunnerPool:
        if self._engine_pool is not None:
            return self._engine_pool
        async with self._starting:
            if self._own is None:
                own = RunnerPool(self.settings.model_copy(update={"runners": 1, "runner_surge": 1}))
                await own.start()
                if not await own.wait_ready():
                    await own.close()
                    raise RuntimeError("no runner process started for trial runs")
                self._own = own
            return self._own

    async def run(self, spec: FlowSpec, claimed: Claimed, node_id: str) -> dict[str, Any]:
        group = queue_group_of(claimed.tenant, claimed.owner_user)
        if self._running[group] >= PER_GROUP:
            raise TooManyRequests(f"At most {PER_GROUP} steps are tested at once per tenant.", retry_after=1)
        self._running[group] += 1
        try:
            pool = await self._pool()
            return outcome_of(await pool.run(spec, claimed), node_id)
        finally:
            self._running[group] -= 1
            if not self._running[group]:
                del self._running[group]

    async def close(self) -> None:
        if self._own is not None:
            with contextlib.suppress(Exception):
                await self._own.close()
            self._own = None
