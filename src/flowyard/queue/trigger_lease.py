"""The engine's own table: one event-trigger lease per flow (triggers/leases.py writes it)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, UTCDateTime


class TriggerLease(Base):
    """Which engine process consumes a flow's event trigger.

    Created with no holder when the flow starts (``lifecycle``), taken by the
    first engine that finds it free or expired, renewed by its holder while it
    consumes, deleted by the holder once it unsubscribed from a stopping flow.
    """

    __tablename__ = "trigger_leases"

    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    flow_version: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    holder: Mapped[str | None] = mapped_column(sa.String(200))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Set by the holder once the consumer is subscribed; cleared while it reconnects.
    subscribed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The last connection problem (shown in the flow's statusMessage), None when consuming.
    problem: Mapped[str | None] = mapped_column(sa.Text)
