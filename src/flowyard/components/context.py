"""What a component function gets besides its message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from flowyard.config import Settings


@dataclass
class Reply:
    """The synchronous webhook reply a ``respond`` node sets."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StepContext:
    execution_id: str
    flow_id: str
    node_id: str
    component_id: str | None
    function: str
    tenant: str | None
    fields: Any
    credentials: dict[str, Any] | None
    settings: Settings
    http: httpx.AsyncClient
    logs: list[dict[str, Any]]
    reply: list[Reply]
    # The execution's owner user: with ``tenant``, whose files and pools a connector may use
    # (the sql component's SQLite sub-directory).
    owner_user: str | None = None
    # Which attempt this is at this message (1-based; SPEC §11 retries).
    attempt: int = 1
    # Stable across the retries and redeliveries of this step on this message in this execution
    # (not across a rerun): a connector passes it to the far side so a repeat has no second effect.
    idempotency_key: str = ""
    # The execution parked for this step on this message (a long ``delay``) and now goes on.
    resumed: bool = False
    # A resumed ``flow`` step (sub-flow): what its child execution came to, ``{"id", "status",
    # "result", "error"}``, or ``{"error"}`` when it could not start; None when it did not finish
    # in time (queue/subflows.py writes it into the parent's continuation).
    child: dict[str, Any] | None = None

    def log(self, level: str, message: str, data: Any = None) -> None:
        """Add an entry to the flow's logs (written with the step's result)."""
        self.logs.append({"level": level, "message": message, "data": data})

    def respond(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.reply[:] = [Reply(status, body, headers or {})]
