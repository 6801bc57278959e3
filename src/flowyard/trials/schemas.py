"""Trial-run schemas: a node and a sample message in, the step's outcome out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StepTrial(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: dict[str, Any] = Field(
        description="The node to run, as in a flow's graph (it need not be saved: the editor's copy)."
    )
    data: Any = Field(None, description="The sample message's data (default: {}).")


class StepTrialOutcome(BaseModel):
    status: Literal["succeeded", "failed"]
    output: Any = Field(
        None,
        description="What the step emitted: one entry per message (a sample of at most 64 KiB, as "
        "stored for a step of an execution).",
    )
    messagesOut: int = 0
    error: str | None = None
    durationMs: float = 0.0
    logs: list[dict[str, Any]] = Field(default_factory=list, description="The log entries the step wrote.")
