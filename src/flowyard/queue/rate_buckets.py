"""Per-flow token buckets of the webhook rate limit, shared by every API process."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id


class WebhookRateBucket(Base):
    """One row per flow that received a webhook while a rate limit was set.

    ``tokens`` were left at ``refilled_at`` (unix seconds); the bucket refills at the
    configured rate up to the burst. Rows are locked and updated in the group
    commit's own transaction, so concurrent API processes share one budget.
    """

    __tablename__ = "webhook_rate_buckets"

    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    tokens: Mapped[float] = mapped_column(sa.Float, nullable=False)
    refilled_at: Mapped[float] = mapped_column(sa.Float, nullable=False)
