"""What the queue hands out and takes back: plain records, importable without the
database layer (runner processes use them and never load SQLAlchemy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Claimed:
    id: str
    flow_id: str
    flow_version: int
    tenant: str | None
    owner_user: str | None
    trigger: str
    input: Any
    attempts: int
    created_at: datetime
    scheduled_for: datetime | None
    # The continuation it starts from (flowyard.queue.continuation): a parked execution being
    # resumed, or a replay; None: from its trigger.
    state: Any = None
    # The flow's version it runs (SPEC §12; None: an execution from before versions).
    history_version: int | None = None


@dataclass
class StepRecord:
    node_id: str
    component_id: str | None
    function: str | None
    status: str
    runs: int
    messages_in: int
    messages_out: int
    duration_ms: float
    started_at: datetime
    finished_at: datetime
    error: str | None
    output: Any
    position: int
    # SPEC §11: how many times the node was called (all messages, all retries), and the error
    # and start time of each failed attempt ({"attempt", "startedAt", "error"}).
    attempts: int = 1
    attempt_errors: list[dict[str, Any]] = field(default_factory=list)
    # The message (data and metadata) a failed step failed on: where a retry goes on from
    # (``POST /executions/{id}/retry``, SPEC §11). None for a step that succeeded.
    input: Any = None
    # The data of the first few messages the step received (a sample, like ``output``): the
    # step debugger's input (served as ``inputs``).
    inputs: Any = None


@dataclass
class Outcome:
    execution_id: str
    flow_id: str
    tenant: str | None
    owner_user: str | None
    created_at: datetime
    status: str  # succeeded | failed | cancelled | waiting (parked: resume_at and state)
    result: Any
    error: str | None
    finished_at: datetime
    steps: list[StepRecord] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    # A parked execution (status ``waiting``): when it is due, and the continuation it goes on
    # from (flowyard.queue.continuation).
    resume_at: datetime | None = None
    state: Any = None
