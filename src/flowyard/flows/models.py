"""Flow tables. ``flow_owners`` mirrors ``flows.owners`` so visibility is an
indexed join rather than a scan of JSON."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, Json, QuotedText, Timestamped, UTCDateTime
from flowyard.ids import new_id

# The FTS5 table (SQLite) holding ``(name_lc, description_lc)`` of every flow for ``search``,
# its rowid the flow's search key (``<name>_keys``: id's second x 2^31 + rank, so key order is
# id order second by second); written only by the triggers of migration 0023 (any write to
# ``flows`` keeps both in step), read by ``api.listing``. Not in the metadata: see
# ``flowyard.models``.
SEARCH_TABLE = "flows_search"


class Flow(Timestamped, Base):
    __tablename__ = "flows"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    description: Mapped[str | None] = mapped_column(sa.Text)
    # Lower-cased copies for case-insensitive search that also folds non-ASCII
    # letters (SQLite's lower() only folds ASCII).
    name_lc: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    description_lc: Mapped[str | None] = mapped_column(sa.Text)
    tenant: Mapped[str | None] = mapped_column(sa.String(64))
    type: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    cron: Mapped[str | None] = mapped_column(sa.String(200))
    graph: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False)
    owners: Mapped[list[dict[str, str]]] = mapped_column(Json, nullable=False, default=list)
    # A FlowStatus (flows/status.py, the one module that moves it); new flows are "inactive".
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False, default="inactive")
    status_message: Mapped[str | None] = mapped_column(QuotedText)
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    # Bumped on every content change: PATCH uses it for compare-and-set.
    version: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=1)
    # SPEC §12: the number of the flow's current version (``flow_versions``, written only by
    # flows/history.py), moved on every change of graph, cron or errorFlowId; served as
    # ``version``. ``version`` above moves on every change of the row (and keys the runners).
    history_version: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=1, server_default="1")
    next_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_execution_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    from_template: Mapped[str | None] = mapped_column(Id)
    # SPEC §11: the flow started when one of this flow's executions ends failed.
    error_flow_id: Mapped[str | None] = mapped_column(Id)
    # Optional HMAC-SHA256 secret for webhook signatures; never returned.
    # Sealed (SecretBox, migration 0015), never plaintext: about 360 characters for a secret of
    # 200. TEXT on PostgreSQL; SQLite ignores the VARCHAR length.
    webhook_secret: Mapped[str | None] = mapped_column(sa.String(200).with_variant(sa.Text(), "postgresql"))
    created_by: Mapped[str | None] = mapped_column(Id)

    __table_args__ = (
        sa.Index("ix_flows_status_id", "status", "id"),
        # filter[status] with a sort: the page is read in index order, no sort step.
        sa.Index("ix_flows_status_updated_at_id", "status", "updated_at", "id"),
        sa.Index("ix_flows_status_created_at_id", "status", "created_at", "id"),
        sa.Index("ix_flows_updated_at_id", "updated_at", "id"),
        sa.Index("ix_flows_created_at_id", "created_at", "id"),
        sa.Index("ix_flows_name_id", "name", "id"),
        # The scheduler's query: active cron flows by due time.
        sa.Index("ix_flows_next_run_at", "next_run_at"),
        # The reconciler's query: flows in transit.
        sa.Index("ix_flows_status_changed", "status", "status_changed_at"),
    )


class FlowOwner(Base):
    __tablename__ = "flow_owners"

    flow_id: Mapped[str] = mapped_column(Id, sa.ForeignKey("flows.id", ondelete="CASCADE"), primary_key=True)
    owner_type: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    owner_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)

    __table_args__ = (sa.Index("ix_flow_owners_owner", "owner_type", "owner_id", "flow_id"),)


class FlowVersion(Base):
    """One version of a flow's runnable content (SPEC §12): written only by flows/history.py."""

    __tablename__ = "flow_versions"

    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    number: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    graph: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False)
    cron: Mapped[str | None] = mapped_column(sa.String(200))
    error_flow_id: Mapped[str | None] = mapped_column(Id)
    # The user whose change made it (NULL: the backfill of migration 0018).
    author: Mapped[str | None] = mapped_column(Id)
    # The version it restored, when made by a restore.
    restored_from: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class FlowCount(Base):
    """How many flows there are per scope of owner entries, status and type (flows/counts.py,
    the one writer): ``meta.total`` of the flow lists. ``''`` stands for "any" (owner ids are
    never empty)."""

    __tablename__ = "flow_counts"

    user_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    status: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    type: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    n: Mapped[int] = mapped_column(sa.Integer, nullable=False)
