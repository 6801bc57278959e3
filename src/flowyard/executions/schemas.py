"""Execution and execution-count schemas."""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from pydantic import BaseModel, Field

from flowyard.clock import Timestamp

ExecutionStatus = Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]


class AttemptError(BaseModel):
    attempt: int
    startedAt: Timestamp
    error: str


class Step(BaseModel):
    nodeId: str
    componentId: str | None = None
    function: str | None = None
    status: Literal["succeeded", "failed", "waiting"] = Field(
        description="`waiting`: the execution is parked at this step (a retry wait or a long delay)."
    )
    runs: int = Field(description="How many times the node ran (once per arriving message).")
    attempts: int = Field(1, description="Calls of the node, every retry included (SPEC §11).")
    attemptErrors: list[AttemptError] = Field(
        default_factory=list, description="Each failed attempt: its number, start time and error."
    )
    messagesIn: int
    messagesOut: int
    durationMs: float
    startedAt: Timestamp
    finishedAt: Timestamp
    error: str | None = None
    output: Any = Field(None, description="The data of the node's first few output messages.")
    inputs: Any = Field(
        None, description="The data of the node's first few input messages (a sample, like output)."
    )
    input: Any = Field(
        None,
        description="A failed step only: the message (data, metadata) it failed on, where "
        "POST /executions/{id}/retry starts.",
    )


class ExecutionOut(BaseModel):
    id: str
    flowId: str
    flowVersion: int | None = Field(
        None, description="The flow's version it ran (SPEC §12; null: from before versions)."
    )
    tenant: str | None = None
    user: str | None = Field(None, description="The flow's user owner.")
    trigger: str = Field(
        description="webhook, cron, manual, event, error (an error flow's run) or flow (a sub-flow's run, "
        "started by the `flow` step of `parentExecutionId`)."
    )
    status: ExecutionStatus
    attempts: int
    createdAt: Timestamp
    startedAt: Timestamp | None = None
    finishedAt: Timestamp | None = None
    scheduledFor: Timestamp | None = None
    error: str | None = None
    input: Any = None
    result: Any = None
    resumeAt: Timestamp | None = Field(None, description="When a waiting execution goes on (SPEC §11).")
    retryOf: str | None = Field(None, description="The execution this one retries from its failed step.")
    rerunOf: str | None = Field(None, description="The execution whose trigger data this one runs again.")
    parentExecutionId: str | None = Field(
        None,
        description="The execution that started it: whose `flow` step called it (trigger flow), or "
        "whose failure started this error flow (trigger error).",
    )


class ExecutionDetail(ExecutionOut):
    steps: list[Step]


class ExecutionQueued(BaseModel):
    executionId: str
    flowId: str
    status: Literal["queued"]


class CountsMetadata(BaseModel):
    start: date
    end: date
    totalExecutions: int


class CountsResponse(BaseModel):
    data: list[dict[str, Any]] = Field(
        description="groupby=user: {_id, user, tenant, allFlows, executions, username}; "
        "groupby=flow: {_id, flow, flowName, tenant, user, executions}; "
        "groupby=component: {_id, component, allFlows, executions}."
    )
    metadata: CountsMetadata
