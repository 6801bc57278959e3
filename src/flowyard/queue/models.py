"""Executions (which double as the durable work queue, and hold their step results), webhook
idempotency keys and the per-day counters behind /icenter/executions."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, JsonValue, QuotedText, UTCDateTime, partial_index
from flowyard.db.compact import CompactId, CompactTime
from flowyard.db.packed import PackedJson

# How long a webhook Idempotency-Key answers with the first execution.
IDEMPOTENCY_WINDOW = timedelta(hours=24)


# The two halves of a user owner's executions, each with partial indexes of its own.
_TENANT, _TENANTLESS = "tenant IS NOT NULL", "tenant IS NULL"
# The queue's live rows, each status in partial indexes of its own (a finished execution, most
# of the table, is in none of them). Written as SQL text, as the queries that read them write
# them (``sa.text``): a partial index serves a query only when the query's WHERE holds its
# predicate as written, and a bound value does not (SQLite's planner, PostgreSQL's generic plans).
QUEUED_ROWS, RUNNING_ROWS = "status = 'queued'", "status = 'running'"
# The rows of a cron tick (the others have no scheduled time): the predicate of the unique index
# that makes a tick one execution, and of the ``ON CONFLICT`` that relies on it (queue/store.py).
SCHEDULED = "scheduled_for IS NOT NULL"


class Execution(Base):
    __tablename__ = "executions"

    # The ids and times an execution repeats in its row and in its list indexes are stored
    # compactly on SQLite (db/compact.py): 12 bytes for an id, an integer for a time. Not
    # ``flow_id``: SQL compares it with ``flows.id`` and ``flow_owners.flow_id`` (text).
    id: Mapped[str] = mapped_column(CompactId(24), primary_key=True)
    # No foreign key: history and counts outlive a deleted flow.
    flow_id: Mapped[str] = mapped_column(Id, nullable=False)
    flow_version: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    # The flow's version (flows.history_version, SPEC §12) it ran; served as ``flowVersion``.
    history_version: Mapped[int | None] = mapped_column(sa.Integer)
    tenant: Mapped[str | None] = mapped_column(CompactId(64))
    owner_user: Mapped[str | None] = mapped_column(CompactId(64))
    trigger: Mapped[str] = mapped_column(sa.String(16), nullable=False)  # webhook | cron | manual
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    input: Mapped[Any] = mapped_column(JsonValue, nullable=True)
    result: Mapped[Any] = mapped_column(JsonValue, nullable=True)
    # The step results, one JSON document in the served shape (queue/steps.py), written
    # with the outcome by the same UPDATE: no row per step. Deferred: lists do not read it.
    # On SQLite packed: deflated against a dictionary of its keys (db/packed.py).
    steps: Mapped[Any] = mapped_column(PackedJson, nullable=True, deferred=True)
    error: Mapped[str | None] = mapped_column(QuotedText)
    created_at: Mapped[datetime] = mapped_column(CompactTime(), nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(CompactTime())
    finished_at: Mapped[datetime | None] = mapped_column(CompactTime())
    # A cron tick's time: (flow_id, scheduled_for) is unique, so however many
    # schedulers run, one tick makes one execution (``SCHEDULED``).
    scheduled_for: Mapped[datetime | None] = mapped_column(CompactTime())
    attempts: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0)
    lease_owner: Mapped[str | None] = mapped_column(sa.String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(CompactTime())
    # Who shares fairly in the queue: "t:<tenant>", or "u:<owner user>" for tenantless flows.
    # Cleared when the execution finishes (queue/status.py): only queued and running rows read it.
    queue_group: Mapped[str | None] = mapped_column(sa.String(80))
    # Waiting (SPEC §11): when a parked execution is due; the continuation it (or a replay)
    # starts from (flowyard.queue.continuation). Deferred: lists do not read the state.
    resume_at: Mapped[datetime | None] = mapped_column(CompactTime())
    state: Mapped[Any] = mapped_column(JsonValue, nullable=True, deferred=True)
    # Replays name their origin; a sub-flow's execution names its caller's.
    retry_of: Mapped[str | None] = mapped_column(CompactId(24))
    rerun_of: Mapped[str | None] = mapped_column(CompactId(24))
    parent_execution_id: Mapped[str | None] = mapped_column(CompactId(24))

    __table_args__ = (
        # One execution per cron tick. Partial: the executions of other triggers (nearly all)
        # have no scheduled time and are not in it (a NULL was never a duplicate anyway).
        partial_index(
            "uq_executions_flow_id_scheduled_for", "flow_id", "scheduled_for", where=SCHEDULED, unique=True
        ),
        # Claim: the oldest queued rows. Reaper: the running rows (few), each lease read from
        # the row. An administrator's ``filter[status]``.
        sa.Index("ix_executions_status_id", "status", "id"),
        # Fair claim: groups with queued work and their oldest rows; what each group runs. The
        # status leads although each index holds one: so SQLite's planner, which has no
        # statistics, prefers them over ix_executions_status_id (two equalities against one).
        partial_index("ix_executions_queued_group_id", "status", "queue_group", "id", where=QUEUED_ROWS),
        partial_index("ix_executions_running_group_id", "status", "queue_group", "id", where=RUNNING_ROWS),
        # Lists (executions/service.py): each filter's rows newest first from one index range.
        # A non-admin's page comes from the tenant and the user owner recorded on the
        # execution; the trailing columns ride along so that the recorded scope and the
        # flow's visibility (a probe of ``flow_owners``) are checked from the index alone,
        # never from the wide row.
        sa.Index("ix_executions_flow_id", "flow_id", "id", "tenant", "owner_user"),
        sa.Index("ix_executions_flow_status_id", "flow_id", "status", "id", "tenant", "owner_user"),
        sa.Index("ix_executions_tenant_id", "tenant", "id", "flow_id"),
        sa.Index("ix_executions_tenant_status_id", "tenant", "status", "id", "flow_id"),
        # The user owner's by the tenant recorded (executions/service.py reads each tenant's
        # range on its own: the few outside the caller's tenant without walking the rest);
        # those of no tenant in partial indexes of their own, since PostgreSQL does not take
        # ``tenant IS NULL`` as an equality that leaves ``id`` in order.
        partial_index(
            "ix_executions_owner_tenant_id", "owner_user", "tenant", "id", "flow_id", where=_TENANT
        ),
        partial_index(
            "ix_executions_owner_tenant_status_id",
            "owner_user",
            "tenant",
            "status",
            "id",
            "flow_id",
            where=_TENANT,
        ),
        partial_index("ix_executions_tenantless_owner_id", "owner_user", "id", "flow_id", where=_TENANTLESS),
        partial_index(
            "ix_executions_tenantless_owner_status_id",
            "owner_user",
            "status",
            "id",
            "flow_id",
            where=_TENANTLESS,
        ),
        # The resumer: due waiting executions from a partial index over the waiting rows only.
        partial_index("ix_executions_waiting_due", "resume_at", where="status = 'waiting'"),
        # A sub-flow's caller (``parent_execution_id = :id`` implies the predicate on both
        # databases): the rows of no caller, nearly all, are not in it.
        partial_index("ix_executions_parent", "parent_execution_id", where="parent_execution_id IS NOT NULL"),
    )


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    execution_id: Mapped[str] = mapped_column(Id, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, index=True)


class FlowDayCount(Base):
    """Executions triggered per flow per UTC day; never pruned."""

    __tablename__ = "flow_day_counts"

    day: Mapped[date] = mapped_column(sa.Date, primary_key=True)
    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    tenant: Mapped[str | None] = mapped_column(sa.String(64))
    user_id: Mapped[str | None] = mapped_column(sa.String(64))
    flow_name: Mapped[str | None] = mapped_column(sa.String(200))
    executions: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)

    # A tenant's counts read only that tenant's rows, from the index alone; an administrator's
    # edge days (queue/periods.py) read every row of a few days, from the index alone.
    __table_args__ = (
        sa.Index(
            "ix_flow_day_counts_tenant", "tenant", "day", "flow_id", "user_id", "flow_name", "executions"
        ),
        sa.Index("ix_flow_day_counts_day", "day", "flow_id", "tenant", "user_id", "flow_name", "executions"),
    )


class ComponentDayCount(Base):
    """Steps run per component per flow per UTC day (the day the execution was triggered)."""

    __tablename__ = "component_day_counts"

    day: Mapped[date] = mapped_column(sa.Date, primary_key=True)
    component_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    tenant: Mapped[str | None] = mapped_column(sa.String(64))
    user_id: Mapped[str | None] = mapped_column(sa.String(64))
    steps: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)

    __table_args__ = (
        sa.Index("ix_component_day_counts_tenant", "tenant", "day", "component_id", "flow_id", "steps"),
        sa.Index("ix_component_day_counts_day", "day", "component_id", "flow_id", "steps"),
    )


# Rollups of the daily counters, written by the same upserts in the same transactions
# (queue/counters.py), so that a frame reads whole months and weeks plus its edge days
# (queue/periods.py). ``period`` is "week" (``start`` its Monday) or "month" (its 1st).
# A rollup row carries the tenant, user and name last written in its period, as a daily row
# does within its day. On SQLite the rows live in their primary key (WITHOUT ROWID): an
# administrator's frame is one range read of the table itself.


class FlowPeriodCount(Base):
    """Executions triggered per flow per ISO week and per calendar month (UTC); never pruned."""

    __tablename__ = "flow_period_counts"

    period: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    start: Mapped[date] = mapped_column(sa.Date, primary_key=True)
    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    tenant: Mapped[str | None] = mapped_column(sa.String(64))
    user_id: Mapped[str | None] = mapped_column(sa.String(64))
    flow_name: Mapped[str | None] = mapped_column(sa.String(200))
    executions: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)

    __table_args__ = (
        sa.Index(
            "ix_flow_period_counts_tenant",
            "tenant",
            "period",
            "start",
            "flow_id",
            "user_id",
            "flow_name",
            "executions",
        ),
        {"sqlite_with_rowid": False},
    )


class ComponentPeriodCount(Base):
    """Steps run per component per flow per ISO week and per calendar month (UTC)."""

    __tablename__ = "component_period_counts"

    period: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    start: Mapped[date] = mapped_column(sa.Date, primary_key=True)
    component_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    flow_id: Mapped[str] = mapped_column(Id, primary_key=True)
    tenant: Mapped[str | None] = mapped_column(sa.String(64))
    user_id: Mapped[str | None] = mapped_column(sa.String(64))
    steps: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    # The days of the period on which steps ran: bit i for the period's i-th day (from 0).
    days: Mapped[int] = mapped_column(sa.BigInteger, nullable=False, server_default="0")

    __table_args__ = (
        sa.Index(
            "ix_component_period_counts_tenant",
            "tenant",
            "period",
            "start",
            "component_id",
            "flow_id",
            "steps",
            "days",
        ),
        {"sqlite_with_rowid": False},
    )
