"""Log entry schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from flowyard.clock import Timestamp


class LogEntryOut(BaseModel):
    id: str
    timestamp: Timestamp
    level: Literal["debug", "info", "warn", "error"]
    message: str
    tenant: str | None = None
    flowId: str | None = None
    executionId: str | None = None
    stepId: str | None = None
    componentId: str | None = None
    data: Any = None
