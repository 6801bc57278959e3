"""The component-facing side of event triggers (triggers/leases.py drives them): what a
trigger function receives and yields. Kept apart from the lease code so that connector
modules, which runner processes import, do not pull in SQLAlchemy and the models."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowyard.config import Settings


@dataclass
class Event:
    """One broker message: ``id`` is the broker's message id (the idempotency key)."""

    id: str
    data: Any
    ack: Callable[[], Awaitable[Any]]
    # Set by a connector that refused the message before reading it whole (over
    # FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES): the reason. The consumer logs and counts it, stores
    # nothing and calls ``ack``, which settles it the broker's way (drop or reject).
    refused: str | None = None


@dataclass
class TriggerContext:
    flow_id: str
    node_id: str
    fields: Any
    credentials: dict[str, Any] | None
    settings: Settings
    subscribed: Callable[[], Awaitable[None]]


TriggerFunction = Callable[[TriggerContext], AsyncIterator[Event]]
