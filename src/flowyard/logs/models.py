"""Step logs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, partial_index
from flowyard.db.compact import CompactId, CompactTime
from flowyard.db.packed import PackedJson, PackedText

# The entries ``showErrors`` lists: the predicate of their partial index and of the query that
# reads it (written as SQL text: a bound value would not match the index's predicate).
ERRORS = sa.text("level = 'error'")


class LogEntry(Base):
    __tablename__ = "logs"

    # Integer key: newest-first is "ORDER BY id DESC" on an index we already have.
    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    # The ids and the time each entry repeats are stored compactly on SQLite (db/compact.py).
    timestamp: Mapped[datetime] = mapped_column(CompactTime(), nullable=False, index=True)
    level: Mapped[str] = mapped_column(sa.String(8), nullable=False)
    # On SQLite packed (db/packed.py): the engine's messages repeat a few phrases.
    message: Mapped[str] = mapped_column(PackedText, nullable=False)
    tenant: Mapped[str | None] = mapped_column(CompactId(64))
    # The flow's user owner, for the entries of no tenant only (logs.append): lets callers
    # without a tenant read their own flows' logs. An entry of a tenant is read by its tenant
    # (iam.visibility.tenant_data_clause), so it does not repeat the user in every row.
    user_id: Mapped[str | None] = mapped_column(CompactId(64))
    flow_id: Mapped[str | None] = mapped_column(CompactId(24))
    execution_id: Mapped[str | None] = mapped_column(CompactId(24))
    step_id: Mapped[str | None] = mapped_column(sa.String(64))
    component_id: Mapped[str | None] = mapped_column(sa.String(200))
    # On SQLite packed (db/packed.py): a step's entry repeats the same five keys.
    data: Mapped[Any] = mapped_column(PackedJson, nullable=True)

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
