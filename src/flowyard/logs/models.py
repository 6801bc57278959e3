"""Step logs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, JsonValue, UTCDateTime, partial_index

# The entries ``showErrors`` lists: the predicate of their partial index and of the query that
# reads it (written as SQL text: a bound value would not match the index's predicate).
ERRORS = sa.text("level = 'error'")


class LogEntry(Base):
    __tablename__ = "logs"

    # Integer key: newest-first is "ORDER BY id DESC" on an index we already have.
    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    timestamp: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, index=True)
    level: Mapped[str] = mapped_column(sa.String(8), nullable=False)
    message: Mapped[str] = mapped_column(sa.Text, nullable=False)
    tenant: Mapped[str | None] = mapped_column(sa.String(64))
    # The flow's user owner: lets callers without a tenant read their own flows' logs.
    user_id: Mapped[str | None] = mapped_column(sa.String(64))
    flow_id: Mapped[str | None] = mapped_column(Id)
    execution_id: Mapped[str | None] = mapped_column(Id)
    step_id: Mapped[str | None] = mapped_column(sa.String(64))
    component_id: Mapped[str | None] = mapped_column(sa.String(200))
    data: Mapped[Any] = mapped_column(JsonValue, nullable=True)

    __table_args__ = (
        sa.Index("ix_logs_tenant_id", "tenant", "id"),
        sa.Index("ix_logs_tenant_flow_id", "tenant", "flow_id", "id"),
        # showErrors: the error entries only (a few in a hundred), not every entry's level.
        partial_index("ix_logs_tenant_errors_id", "tenant", "id", where=ERRORS),
        sa.Index("ix_logs_execution_id", "execution_id", "id"),
        sa.Index("ix_logs_tenant_step_id", "tenant", "step_id", "id"),
        # A tenantless caller's logs (its own flows', logs/service.py), newest first.
        partial_index("ix_logs_tenantless_user_id", "user_id", "id", where="tenant IS NULL"),
    )
