"""Executions: manual runs, listing, reading, and the per-day counts. No HTTP here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import undefer

from flowyard import ids
from flowyard.api.listing import ListQuery, bounded_total
from flowyard.clock import isoformat, utcnow
from flowyard.db import dialect
from flowyard.errors import Conflict, InvalidInput, NotFound, Problem
from flowyard.flows import service as flows
from flowyard.flows.models import Flow, FlowOwner
from flowyard.flows.status import FlowStatus
from flowyard.iam import permissions as perms
from flowyard.iam.models import User
from flowyard.iam.principal import Principal
from flowyard.iam.visibility import tenant_data_clause
from flowyard.ids import is_valid_id, new_id
from flowyard.queue import periods
from flowyard.queue import store as queue
from flowyard.queue.models import (
    ComponentDayCount,
    ComponentPeriodCount,
    Execution,
    FlowDayCount,
    FlowPeriodCount,
)
from flowyard.queue.status import EXECUTION_STATUSES

EXECUTION_FILTERS = frozenset({"flowId", "status"})
FLOW_EXECUTION_FILTERS = frozenset({"status"})
GROUPINGS = ("user", "flow", "component")


# Who sees what (SPEC §2), decided here and nowhere else:
# - executions (list, get): ``tenant.flows.read`` and ``visible_clause``: the executions of the
#   flows the caller sees (the flow rule of flows/service.py), listed by the tenant and user
#   owner recorded on each execution when it was created (docs/api.md "Executions"); running by
#   hand: ``tenant.flows.update`` and a visible flow (``run_manually``);
# - counts (and logs, logs/service.py): any authenticated caller, ``tenant_data_clause`` (iam/visibility.py).


def _recorded(principal: Principal) -> sa.ColumnElement[bool]:
    """A non-admin's executions by what was recorded on them at creation: those of its tenant,
    and those charged to it as their flow's user owner (a tenantless caller has the latter
    only). ``_recorded_parts`` splits it into index ranges."""
    mine: sa.ColumnElement[bool] = Execution.owner_user == principal.user_id
    if not principal.tenant_id:
        return mine
    return sa.or_(Execution.tenant == principal.tenant_id, mine)


def _not_recorded(principal: Principal) -> sa.ColumnElement[bool]:
    """The rest: recorded neither on the caller's tenant nor on it as user owner. NULL-safe
    (``_recorded`` is NULL, not false, for an execution of a flow without a user owner)."""
    return sa.not_(sa.func.coalesce(_recorded(principal), sa.false()))


def _recorded_parts(
    principal: Principal, own_tenants: Sequence[str | None] | None = None
) -> list[sa.ColumnElement[bool]]:
    """A non-admin's executions by what was recorded on them at creation (its tenant's, and
    those charged to it as their flow's user owner; a tenantless caller has the latter only),
    as disjoint parts that each read one index range in id order: the caller's tenant's
    (``ix_executions_tenant_id``); then those charged to it outside that tenant, one part per
    tenant they were recorded on (``own_tenants``, from ``_scope``:
    ``ix_executions_owner_tenant_id`` is in id order within one owner and tenant, and
    ``ix_executions_tenantless_owner_id`` within one owner and no tenant). Without
    ``own_tenants`` (too many), one part that a page must sort."""
    mine: sa.ColumnElement[bool] = Execution.owner_user == principal.user_id
    parts: list[sa.ColumnElement[bool]] = []
    if principal.tenant_id:
        parts.append(Execution.tenant == principal.tenant_id)
    if own_tenants is None:
        # Two parts, each read from one of the owner's partial indexes: those of no tenant in
        # id order, those of the other tenants (their order sorted by the page).
        others: sa.ColumnElement[bool] = Execution.tenant.is_not(None)
        if principal.tenant_id:
            others = sa.and_(others, Execution.tenant != principal.tenant_id)
        return [*parts, sa.and_(mine, Execution.tenant.is_(None)), sa.and_(mine, others)]
    for tenant in own_tenants:
        recorded = Execution.tenant.is_(None) if tenant is None else Execution.tenant == tenant
        parts.append(sa.and_(mine, recorded))
    return parts


# The tenants a caller's own executions outside its tenant were recorded on, read one by one
# as parts of a page (each an index range in id order, merged) up to this many; past it, as one
# range that a page must sort. Few by nature: a flow's tenant is its user owner's, but for flows
# an administrator made for a user of another tenant, or before the user joined one.
_OWN_TENANT_ARMS = 8


async def _scope(
    session: AsyncSession, principal: Principal
) -> tuple[list[str] | None, list[str | None] | None]:
    """What a non-admin's page is made of beyond its tenant's range, in one statement: the
    flows it sees through an added owner (``_added_owner_flows``; ``None`` past
    ``_ADDED_FLOW_ARMS``), and the tenants (``None`` for none) that executions charged to it
    as user owner were recorded on, but for its own tenant (a loose scan of
    ``ix_executions_owner_tenant_id``: one probe per tenant, however many executions; ``None``
    past ``_OWN_TENANT_ARMS``)."""
    mine = Execution.owner_user == principal.user_id
    kind: Any = sa.literal_column("kind")
    value: Any = sa.literal_column("value")

    def tagged(tag: str, query: sa.Select[Any]) -> sa.Select[Any]:
        # Read as a recorded tenant: a UNION's cells take no column's type, and a tenant is
        # stored compactly on SQLite (db/compact.py; a flow id's text reads as it is).
        inner = query.subquery()
        return sa.select(
            sa.literal(tag).label("kind"), sa.type_coerce(inner.c[0], Execution.tenant.type).label("value")
        )

    tenants = dialect.distinct_values(Execution.tenant, mine, cap=_OWN_TENANT_ARMS + 2)
    none = sa.select(sa.literal(None, sa.String)).where(sa.exists().where(mine, Execution.tenant.is_(None)))
    rows = (
        await session.execute(
            sa.union_all(
                tagged("flow", _added_owner_flows(principal).limit(_ADDED_FLOW_ARMS + 1)),
                tagged("tenant", tenants),
                tagged("none", none),
            ).order_by(kind, value)
        )
    ).all()
    added = [v for k, v in rows if k == "flow"]
    others: list[str | None] = [v for k, v in rows if k == "tenant" and v != principal.tenant_id]
    if any(k == "none" for k, _v in rows):
        others.insert(0, None)
    return (
        added if len(added) <= _ADDED_FLOW_ARMS else None,
        others if len(others) <= _OWN_TENANT_ARMS else None,
    )


def _added_owner_flows(principal: Principal) -> sa.Select[str]:
    """The flows the caller sees whose executions may be recorded on neither its tenant nor
    itself: a flow of another tenant (or of none) that an administrator gave the caller (or its
    tenant) as an added owner; for a tenantless caller, a flow with another user owner too. Few
    by nature, so their executions are read through the ``flow_id`` index."""
    other = FlowOwner.__table__.alias("other_owner")
    if principal.tenant_id:
        added: sa.ColumnElement[bool] = sa.or_(Flow.tenant.is_(None), Flow.tenant != principal.tenant_id)
    else:
        added = sa.or_(
            Flow.tenant.is_not(None),
            sa.exists().where(
                other.c.flow_id == Flow.id,
                other.c.owner_type == "user",
                other.c.owner_id != principal.user_id,
            ),
        )
    return sa.select(Flow.id).where(Flow.id.in_(flows.visible_flow_ids(principal)), added)


# Added-owner flows read one by one in a list (an index range in id order each, merged) up to
# this many; past it, as one IN range that a page must sort.
_ADDED_FLOW_ARMS = 32


def visible_parts(
    principal: Principal,
    added_flows: Sequence[str] | None = None,
    own_tenants: Sequence[str | None] | None = None,
    *,
    owned_as_set: bool = False,
) -> list[sa.ColumnElement[bool]]:
    """The executions the caller may see (SPEC §2: the executions of the flows it sees), as
    disjoint parts that each use an index:

    - recorded on the caller's tenant, or charged to the caller as user owner (``_recorded_parts``,
      one part per tenant in ``own_tenants``), and of a flow the caller sees now
      (``flows.owned_clause``: a probe of ``flow_owners`` from the ``flow_id`` the list
      indexes carry; with ``owned_as_set``, against the set of them: ``flows.owned_set_clause``);
    - the rest of the executions of the flows the caller sees through an added owner
      (``_added_owner_flows``), read by flow: with ``added_flows`` (those flows, read first by
      ``list_executions``), one part per flow, each one index range in id order; without, one
      part over all of them.

    A deleted flow has no owners left: its executions leave the caller's lists with it (admins
    still see them; counts and logs keep them). Admins see every execution.
    """
    if principal.is_admin:
        return [sa.true()]
    owned = (
        flows.owned_set_clause(principal, Execution.flow_id)
        if owned_as_set
        else flows.owned_clause(principal, Execution.flow_id, per_row=True)
    )
    parts = [sa.and_(part, owned) for part in _recorded_parts(principal, own_tenants)]
    not_recorded = _not_recorded(principal)
    if added_flows is None:
        parts.append(sa.and_(Execution.flow_id.in_(_added_owner_flows(principal)), not_recorded))
    else:
        parts += [sa.and_(Execution.flow_id == fid, not_recorded) for fid in added_flows]
    return parts


async def flow_parts(
    session: AsyncSession, principal: Principal, flow_id: str
) -> list[sa.ColumnElement[bool]]:
    """``visible_parts`` for the executions of one flow (``filter[flowId]``): the flow's
    visibility is the same for each of its rows, so it is decided once here (a probe of
    ``flow_owners``), and the page is one range of the flow's index in id order with the
    recorded tenant and owner (in that index) as a filter, with no probe per row. None if the
    caller does not see the flow; all of its executions if it sees the flow through an added
    owner (``_added_owner_flows``), else those recorded on its tenant or on it."""
    mine = Execution.flow_id == flow_id
    if principal.is_admin:
        return [mine]
    seen, added = (
        await session.execute(
            sa.select(
                flows.owned_clause(principal, sa.literal(flow_id)),
                sa.exists(_added_owner_flows(principal).where(Flow.id == flow_id)),
            )
        )
    ).one()
    if not seen:
        return []
    return [mine] if added else [sa.and_(mine, _recorded(principal))]


def visible_clause(principal: Principal) -> sa.ColumnElement[bool]:
    return sa.or_(*visible_parts(principal))


async def run_manually(session: AsyncSession, principal: Principal, flow_id: str, payload: Any) -> str:
    principal.require(perms.FLOWS_UPDATE)
    flow = await flows.get_flow(session, principal, flow_id)
    if flow.status != FlowStatus.ACTIVE:
        raise Conflict(f"Flow is not active. Current status: {flow.status}")
    eid = new_id()
    await queue.enqueue(
        session,
        [
            queue.NewExecution(
                id=eid,
                flow_id=flow.id,
                flow_version=flow.version,
                history_version=flow.history_version,
                flow_name=flow.name,
                tenant=flow.tenant,
                owner_user=queue.owner_user_of(flow.owners),
                trigger="manual",
                input=payload,
                created_at=utcnow(),
            )
        ],
    )
    return eid


def to_dict(e: Execution) -> dict[str, Any]:
    ts = lambda v: isoformat(v) if v is not None else None  # noqa: E731
    return {
        "id": e.id,
        "flowId": e.flow_id,
        "flowVersion": e.history_version,
        "tenant": e.tenant,
        "user": e.owner_user,
        "trigger": e.trigger,
        "status": e.status,
        "attempts": e.attempts,
        "createdAt": isoformat(e.created_at),
        "startedAt": ts(e.started_at),
        "finishedAt": ts(e.finished_at),
        "scheduledFor": ts(e.scheduled_for),
        "error": e.error,
        "input": e.input,
        "result": e.result,
        "resumeAt": ts(e.resume_at),
        "retryOf": e.retry_of,
        "rerunOf": e.rerun_of,
        "parentExecutionId": e.parent_execution_id,
    }


def steps_of(e: Execution) -> list[dict[str, Any]]:
    """The execution's step results as stored (queue/steps.py): none before it finished, nor
    when ``flowyard check --quarantine`` kept an unreadable document as a string of its text."""
    return list(e.steps) if isinstance(e.steps, list) else []


async def list_executions(
    session: AsyncSession, principal: Principal, lq: ListQuery
) -> tuple[Sequence[Execution], int, bool]:
    """A page of the executions the caller sees, newest first, with ``meta.total`` and
    whether it is exact (``listing.bounded_total``)."""
    principal.require(perms.FLOWS_READ)
    where: list[sa.ColumnElement[bool]] = []
    problems = []
    if "flowId" in lq.filters:
        if not is_valid_id(lq.filters["flowId"]):
            problems.append(
                Problem("filter[flowId] must be a flow id (24 hex characters).", "filter[flowId]")
            )
        where.append(Execution.flow_id == lq.filters["flowId"])
    if "status" in lq.filters:
        if lq.filters["status"] not in EXECUTION_STATUSES:
            problems.append(
                Problem(f"filter[status] must be one of {', '.join(EXECUTION_STATUSES)}.", "filter[status]")
            )
        where.append(Execution.status == lq.filters["status"])
    if problems:
        raise InvalidInput(problems)
    # Each part read on its own: OR-ed together they defeat the indexes. Every part is one
    # index range in id order (models.Execution's list indexes); the total is counted up to
    # a bound, and a page is read from the part that has rows (the usual case: a member's
    # executions are its tenant's) or merged from both (dialect.newest_of).
    # A page merges its parts newest first; a part over several flows (an IN range) is not in
    # id order, so a merge would read all its rows (every execution of those flows with the
    # status, however old): the flows are read first and each made a part of its own.
    # The same for the caller's own executions outside its tenant: read by the tenant they
    # were recorded on, never by walking all of its own executions for the few outside.
    # One flow's executions (filter[flowId]): the flow's visibility decided once, one range.
    if "flowId" in lq.filters:
        parts = await flow_parts(session, principal, lq.filters["flowId"])
        if not parts:
            return [], 0, True
    else:
        added: Sequence[str] | None = None
        own: Sequence[str | None] | None = None
        if not principal.is_admin:
            added, own = await _scope(session, principal)
        # "A flow the caller sees" is checked against the set of them, built once per
        # statement, not by a probe of flow_owners per row (flows.owned_set_clause): a count
        # and a page at page 500 each pass ~6,000 rows.
        parts = visible_parts(principal, added, own, owned_as_set=True)
    parts = [sa.and_(part, *where) for part in parts]
    arms = [sa.select(Execution.id).where(part) for part in parts]
    total = await bounded_total(session, arms, offset=lq.offset)
    if not total.used or (total.exact and lq.offset >= total.count):
        return [], total.count, total.exact
    newest = Execution.id.desc()
    used = [arms[i] for i in total.used]
    if len(used) == 1:  # the usual case: one index range in id order
        ids: Any = used[0].order_by(newest).limit(lq.size).offset(lq.offset)
    else:
        ids = dialect.newest_of(session, used, limit=lq.size, offset=lq.offset)
    page_query = sa.select(Execution).where(Execution.id.in_(ids.subquery().select())).order_by(newest)
    return (await session.scalars(page_query)).all(), total.count, total.exact


async def list_flow_executions(
    session: AsyncSession, principal: Principal, flow_id: str, lq: ListQuery
) -> tuple[Sequence[Execution], int, bool]:
    """One existing flow's executions: 404 unless the flow exists and is visible."""
    principal.require(perms.FLOWS_READ)
    await flows.get_flow(session, principal, flow_id)
    return await list_executions(session, principal, replace(lq, filters={**lq.filters, "flowId": flow_id}))


async def get_execution(session: AsyncSession, principal: Principal, execution_id: str) -> Execution:
    principal.require(perms.FLOWS_READ)
    ids.check_id(execution_id, "execution")
    e = await session.scalar(
        sa.select(Execution)
        .options(undefer(Execution.steps))
        .where(Execution.id == execution_id, visible_clause(principal))
    )
    if e is None:
        raise NotFound(f"Execution {execution_id} not found.")
    return e


# A frame of at most this many single periods is read one period at a time (see _pieces).
MAX_SINGLE_PIECES = 64


def _pieces(
    principal: Principal,
    start: date,
    end: date,
    day_table: Any,
    period_table: Any,
    columns: Sequence[Any],
    *,
    single: bool = False,
) -> list[sa.Select[Any]]:
    """The counter rows of ``start``..``end`` in the caller's scope, as one ``SELECT`` per
    piece of the frame: its whole months and weeks from the rollups, its edge days from the
    daily counters (periods.cover), each piece a range read of an index. ``columns`` are
    column names or functions of the table (as ``lambda t: ...``).

    ``single``: one ``SELECT`` per single day, week or month (while the frame has at most
    MAX_SINGLE_PIECES of them), each then an equality on the index's leading columns, so
    that its rows come in the order of the index's next columns (component, then flow)
    and can be merged or grouped without a sort."""
    cover = periods.cover(start, end)
    d, p = day_table, period_table

    def cols(t: Any) -> list[Any]:
        return [getattr(t, c) if isinstance(c, str) else c(t) for c in columns]

    def day_select(first: date, last: date) -> sa.Select[Any]:
        scope = tenant_data_clause(principal, d.tenant, d.user_id)
        when = d.day == first if first == last else sa.and_(d.day >= first, d.day <= last)
        return sa.select(*cols(d)).where(when, scope)

    def period_select(period: str, first: date, last: date) -> sa.Select[Any]:
        scope = tenant_data_clause(principal, p.tenant, p.user_id)
        when = p.start == first if first == last else sa.and_(p.start >= first, p.start <= last)
        return sa.select(*cols(p)).where(p.period == period, when, scope)

    if single and cover.count() <= MAX_SINGLE_PIECES:
        return [
            day_select(first, first) if kind == periods.DAY else period_select(kind, first, first)
            for kind, first in periods.pieces(cover)
        ]
    parts = [day_select(first, last) for first, last in cover.days]
    for period, ranges in ((periods.WEEK, cover.weeks), (periods.MONTH, cover.months)):
        parts += [period_select(period, first, last) for first, last in ranges]
    return parts


def _frame_rows(
    principal: Principal, start: date, end: date, day_table: Any, period_table: Any, columns: Sequence[str]
) -> Any:
    """The counter rows of ``start``..``end`` in the caller's scope (``_pieces``), as one subquery."""
    parts = _pieces(principal, start, end, day_table, period_table, columns)
    if not parts:  # an empty frame (start after end)
        parts.append(sa.select(*(getattr(day_table, c) for c in columns)).where(sa.false()))
    if len(parts) == 1:
        return parts[0].subquery()
    return sa.union_all(*parts).subquery()


def _month_starts(first: date, last: date) -> list[date]:
    """The 1sts of the months ``first``..``last`` (both 1sts)."""
    n0, n1 = first.year * 12 + first.month - 1, last.year * 12 + last.month - 1
    return [date(n // 12, n % 12 + 1, 1) for n in range(n0, n1 + 1)]


async def _component_counts(
    session: AsyncSession, principal: Principal, start: date, end: date
) -> list[dict[str, Any]]:
    """Steps run per component and the flows that ran it, in two statements that never sort
    the frame's rows per component and flow (39,000 for an administrator's 90 days):

    - the flows: the distinct (component, flow) pairs of the month rollups the frame touches,
      a month it holds in part only where the pair ran on one of its days inside the frame
      (the rows' ``days`` bits); one ``SELECT`` per month, each in index order, which SQLite
      merges into the distinct pairs (``UNION``, no temporary B-tree), grouped into one
      comma-joined list per component (flow ids are hex);
    - the steps: the frame's whole months and weeks and its edge days (periods.cover), each
      single period's rows summed per component as they come in index order, then the few
      sums per component added up."""
    p = ComponentPeriodCount
    pairs_of = sa.select(p.component_id, p.flow_id).where(
        p.period == periods.MONTH, tenant_data_clause(principal, p.tenant, p.user_id)
    )
    partial, whole = periods.months_touched(start, end)
    pair_arms = [pairs_of.where(p.start == first, p.days.op("&")(mask) != 0) for first, mask in partial]
    if whole is not None:
        months = _month_starts(*whole)
        if len(months) <= MAX_SINGLE_PIECES:
            pair_arms += [pairs_of.where(p.start == first) for first in months]
        else:
            pair_arms.append(pairs_of.where(p.start >= whole[0], p.start <= whole[1]))
    if not pair_arms:
        return []
    if len(pair_arms) == 1:
        pairs = pair_arms[0].distinct().subquery()
    else:
        pairs = (
            sa.union(*pair_arms)
            .order_by(sa.literal_column("component_id"), sa.literal_column("flow_id"))
            .subquery()
        )
    joined = sa.select(pairs.c.component_id, dialect.joined_strings(session, pairs.c.flow_id))
    flow_lists: dict[str, str] = {
        cid: flow_ids
        for cid, flow_ids in (await session.execute(joined.group_by(pairs.c.component_id))).all()
    }
    step_arms = [
        arm.group_by(arm.selected_columns[0])
        for arm in _pieces(
            principal,
            start,
            end,
            ComponentDayCount,
            p,
            ("component_id", lambda t: sa.func.sum(t.steps).label("steps")),
            single=True,
        )
    ]
    steps = step_arms[0].subquery() if len(step_arms) == 1 else sa.union_all(*step_arms).subquery()
    sums = (
        await session.execute(
            sa.select(steps.c.component_id, sa.func.sum(steps.c.steps)).group_by(steps.c.component_id)
        )
    ).all()
    return [
        {
            "_id": cid,
            "component": cid,
            "allFlows": flow_lists[cid].split(",") if cid in flow_lists else [],
            "executions": int(n),
        }
        for cid, n in sums
    ]


async def counts(
    session: AsyncSession, principal: Principal, *, start: date, end: date, groupby: str
) -> tuple[list[dict[str, Any]], int]:
    """Execution counts from the counters (cheap whatever the history's size): whole months
    and weeks from the rollups, edge days from the per-day counters."""
    if groupby == "component":
        records = await _component_counts(session, principal, start, end)
        return _sorted(records), await _total(session, principal, start, end)
    f = _frame_rows(
        principal,
        start,
        end,
        FlowDayCount,
        FlowPeriodCount,
        ("flow_id", "tenant", "user_id", "flow_name", "executions"),
    ).c
    rows = (
        await session.execute(
            sa.select(
                f.flow_id,
                sa.func.max(f.tenant),
                sa.func.max(f.user_id),
                sa.func.max(f.flow_name),
                sa.func.sum(f.executions),
            ).group_by(f.flow_id)
        )
    ).all()
    total = sum(int(r[4]) for r in rows)
    if groupby == "flow":
        names = (
            dict(
                (
                    await session.execute(
                        sa.select(Flow.id, Flow.name).where(Flow.id.in_([r[0] for r in rows]))
                    )
                ).all()
            )
            if rows
            else {}
        )
        return _sorted(
            {
                "_id": fid,
                "flow": fid,
                "flowName": names.get(fid, name),
                "tenant": tenant,
                "user": user,
                "executions": int(n),
            }
            for fid, tenant, user, name, n in rows
        ), total
    by_user: dict[str, dict[str, Any]] = {}
    for fid, tenant, user, _name, n in rows:
        key = user or ""
        if key not in by_user:
            by_user[key] = {"_id": key, "user": key, "tenant": tenant, "allFlows": [], "executions": 0}
        by_user[key]["allFlows"].append(fid)
        by_user[key]["executions"] += int(n)
    ids = [k for k in by_user if is_valid_id(k)]
    usernames = (
        dict((await session.execute(sa.select(User.id, User.username).where(User.id.in_(ids)))).all())
        if ids
        else {}
    )
    for key, rec in by_user.items():
        rec["username"] = usernames.get(key, key or "unknown")
        rec["allFlows"].sort()
    return _sorted(by_user.values()), total


async def _total(session: AsyncSession, principal: Principal, start: date, end: date) -> int:
    f = _frame_rows(principal, start, end, FlowDayCount, FlowPeriodCount, ("executions",)).c
    return int(await session.scalar(sa.select(sa.func.coalesce(sa.func.sum(f.executions), 0))) or 0)


def _sorted(records: Any) -> list[dict[str, Any]]:
    out = list(records)
    for rec in out:
        if "allFlows" in rec:
            rec["allFlows"].sort()
    out.sort(key=lambda r: (-r["executions"], r["_id"]))
    return out
