"""Flows: create, list, read, update, delete, start and stop. No HTTP here.

Every state-dependent write is a conditional UPDATE/DELETE on ``status`` (and,
for PATCH, on ``version``), so concurrent requests can never produce a state
the seed's table does not allow.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import ids
from flowyard.api.listing import (
    ListQuery,
    Sortable,
    bounded_count,
    bounded_rows,
    keyed_search,
    keyed_search_candidates,
    keyed_search_page,
    keyed_search_params,
    order_by,
    search_clause,
)
from flowyard.clock import isoformat, utcnow
from flowyard.components.builtins import flow_refusal
from flowyard.components.cron import next_after
from flowyard.components.registry import Registry, TriggerProblem, trigger_node
from flowyard.db.dialect import dialect_name
from flowyard.db.fast import Fetch, Row
from flowyard.db.session import Database
from flowyard.errors import Conflict, Forbidden, InvalidInput, NotFound, Problem
from flowyard.flows import counts, history, portable
from flowyard.flows.models import SEARCH_TABLE, Flow, FlowOwner
from flowyard.flows.status import FlowStatus
from flowyard.flows.status import move as move_status
from flowyard.flows.validation import validate_flow_body
from flowyard.iam import permissions as perms
from flowyard.iam import policy
from flowyard.iam.models import User
from flowyard.iam.principal import Principal
from flowyard.iam.visibility import owner_user_of, shares_owner
from flowyard.ids import new_id
from flowyard.secrets import service as secrets

FLOW_FILTERS = frozenset({"status", "type", "user"})
FLOW_SORTS = frozenset({"createdAt", "updatedAt", "name"})
_STATUS_FILTER = {
    **{s.value: s for s in FlowStatus},
    "1": FlowStatus.ACTIVE,
    "0": FlowStatus.INACTIVE,
}
_TYPE_FILTER = {"ordinary": "ordinary", "realtime": "realtime", "long_running": "realtime"}
# What the list accepts, for the OpenAPI document (flows.router).
STATUS_FILTER_VALUES = sorted(_STATUS_FILTER)
TYPE_FILTER_VALUES = sorted(_TYPE_FILTER)
SORT_VALUES = sorted(FLOW_SORTS | {f"-{s}" for s in FLOW_SORTS})


def check_id(flow_id: str) -> None:
    ids.check_id(flow_id, "flow")


def not_found(flow_id: str) -> NotFound:
    return NotFound(f"Flow {flow_id} not found.")


# The one flow-visibility rule (SPEC §2): admins (``all``) see every flow; anyone else sees a
# flow iff one of its owners is the caller (``user``) or the caller's tenant (``tenant``).
# ``Principal.owner_keys`` says which owner entries name the caller; the forms below (a set of
# flow ids, a clause on flows, a check of one loaded flow) all use it, and so do executions.


class Viewer(Protocol):
    """What the visibility forms below read of a caller: a ``Principal``, or ``_BOUND_*`` (its
    owner keys as bind parameters, for statements built once per shape)."""

    @property
    def is_admin(self) -> bool: ...

    def owner_keys(self) -> list[tuple[str, Any]]: ...


class _BoundViewer:
    """A non-admin caller whose owner keys are the bind parameters ``vis_user`` (and
    ``vis_tenant``): a statement built with it serves every caller of that shape."""

    is_admin = False

    def __init__(self, *, tenant: bool) -> None:
        self._keys: list[tuple[str, Any]] = [("user", sa.bindparam("vis_user", type_=sa.String))]
        if tenant:
            self._keys.append(("tenant", sa.bindparam("vis_tenant", type_=sa.String)))

    def owner_keys(self) -> list[tuple[str, Any]]:
        return list(self._keys)


def _viewer_params(principal: Principal) -> dict[str, str]:
    """The values of ``_BoundViewer``'s parameters for ``principal``."""
    keys = dict(principal.owner_keys())
    return {"vis_user": keys["user"], **({"vis_tenant": keys["tenant"]} if "tenant" in keys else {})}


def visible_flow_ids(principal: Viewer) -> sa.Select[str]:
    """Ids of the flows a non-admin caller sees (do not use for admins: they see all)."""
    conds = [sa.and_(FlowOwner.owner_type == t, FlowOwner.owner_id == i) for t, i in principal.owner_keys()]
    return sa.select(FlowOwner.flow_id).where(sa.or_(*conds))


def visible_clause(principal: Viewer) -> sa.ColumnElement[bool]:
    """Flows whose owners include the caller or its tenant; everything for admins."""
    if principal.is_admin:
        return sa.true()
    return Flow.id.in_(visible_flow_ids(principal))


def owned_clause(principal: Viewer, flow_id: Any, *, per_row: bool = False) -> sa.ColumnElement[bool]:
    """``flow_id`` is visible to a non-admin caller: a primary-key probe of ``flow_owners``.

    ``per_row``: the probe as a scalar subquery (``LIMIT 1``), which PostgreSQL keeps as a
    check of each row instead of turning it into a join over every visible flow and a sort
    of their rows; for rows read in index order until a page is full (executions/service.py)."""
    o = FlowOwner.__table__.alias("owned")
    keys = [sa.and_(o.c.owner_type == t, o.c.owner_id == i) for t, i in principal.owner_keys()]
    if per_row:
        probe = sa.select(sa.literal(1)).where(o.c.flow_id == flow_id, sa.or_(*keys)).limit(1)
        return probe.scalar_subquery().is_not(None)
    return sa.exists().where(o.c.flow_id == flow_id, sa.or_(*keys))


def owned_set_clause(principal: Viewer, flow_id: Any) -> sa.ColumnElement[bool]:
    """``flow_id`` is among the flows a non-admin caller sees, checked against the set of them
    built once per statement: SQLite keeps it as an in-memory index (``LIST SUBQUERY``), and
    PostgreSQL as a hashed subplan (the ``IS TRUE`` keeps it from becoming a join, which would
    lose the index order of the rows it filters). For many rows read in index order until a
    page is full (executions/service.py): ~0.2 us a row against ~0.6 us (SQLite) and ~1.4 us
    (PostgreSQL) for ``owned_clause(per_row=True)``'s probe."""
    return flow_id.in_(visible_flow_ids(principal)).is_(sa.true())


def _visible_id_page(
    principal: Viewer, *, limit: Any, offset: Any, end: Any | None = None
) -> sa.CompoundSelect[Any]:
    """A page of the ids a non-admin caller sees, in id order, from the visibility index
    alone: each owner key's index range is already in id order.

    SQLite merges the ranges (MERGE (UNION), no sort) and stops once the page is full (offset
    5,000 in 0.7 ms). PostgreSQL hashes them instead, all of them: a member's ~11,000 entries
    at 100,000 flows, 6-10 ms for page 1. With ``end`` (offset + size; PostgreSQL) each range is
    read up to there only, as a page's ids are among the first ``end`` of each range: page 1
    then costs 0.2 ms, also under a prepared statement's generic plan. (On SQLite the bounded
    ranges must be subqueries, which it sorts again: page 500 took twice as long.)"""
    owners = FlowOwner.__table__
    parts = []
    for kind, owner in principal.owner_keys():
        part = sa.select(owners.c.flow_id).where(owners.c.owner_type == kind, owners.c.owner_id == owner)
        if end is not None:
            head = part.order_by(owners.c.flow_id).limit(end).subquery()
            part = sa.select(head.c.flow_id)
        parts.append(part)
    return sa.union(*parts).order_by("flow_id").limit(limit).offset(offset)


def is_visible(principal: Principal, flow: Flow | Row) -> bool:
    return principal.is_admin or principal.owns(flow.owners)


def to_dict(flow: Flow | Row) -> dict[str, Any]:
    return {
        "id": flow.id,
        "name": flow.name,
        "description": flow.description,
        "tenant": flow.tenant,
        "graph": flow.graph,
        "type": flow.type,
        "cron": flow.cron,
        "owners": flow.owners,
        "status": flow.status,
        "statusMessage": flow.status_message,
        "nextRunAt": isoformat(flow.next_run_at) if flow.next_run_at else None,
        "lastExecutionAt": isoformat(flow.last_execution_at) if flow.last_execution_at else None,
        "fromTemplate": flow.from_template,
        "webhookSigned": flow.webhook_secret is not None,
        "errorFlowId": flow.error_flow_id,
        "version": flow.history_version,
        "createdAt": isoformat(flow.created_at),
        "updatedAt": isoformat(flow.updated_at),
    }


async def get_flow(
    session: AsyncSession, principal: Principal, flow_id: str, *, for_update: bool = False
) -> Flow:
    check_id(flow_id)
    query = sa.select(Flow).where(Flow.id == flow_id)
    if for_update:
        query = query.with_for_update()
    flow = await session.scalar(query)
    if flow is None or not is_visible(principal, flow):
        raise not_found(flow_id)
    return flow


# The columns to_dict and is_visible read: what GET /flows/{id} and the list pages read
# straight from the driver (db/fast.py: no ORM session).
_SHOWN = [
    c
    for c in Flow.__table__.c
    if c.key not in ("name_lc", "description_lc", "version", "created_by", "status_changed_at")
]
_READ_ONE = Fetch(sa.select(*_SHOWN).where(Flow.__table__.c.id == sa.bindparam("flow_id")))


async def read_flow(db: Database, principal: Principal, flow_id: str) -> dict[str, Any]:
    """One flow as the API shows it; 404 when it does not exist or the caller may not see it."""
    principal.require(perms.FLOWS_READ)
    check_id(flow_id)
    flow = await _READ_ONE.first(db, flow_id=flow_id)
    if flow is None or not is_visible(principal, flow):
        raise not_found(flow_id)
    return to_dict(flow)


def _flow_filters(f: dict[str, str]) -> tuple[FlowStatus | None, str | None, str | None]:
    """``filter[status]``, ``filter[type]`` and ``filter[user]``, checked (every problem at once)."""
    problems = []
    status = kind = user = None
    if "status" in f:
        status = _STATUS_FILTER.get(f["status"])
        if status is None:
            problems.append(
                Problem(
                    "filter[status] must be active, inactive, starting, stopping, 1 or 0.", "filter[status]"
                )
            )
    if "type" in f:
        kind = _TYPE_FILTER.get(f["type"])
        if kind is None:
            problems.append(
                Problem("filter[type] must be ordinary, realtime or long_running.", "filter[type]")
            )
    if "user" in f:
        user = f["user"]
        if not user or len(user) > 64:
            problems.append(Problem("filter[user] must be a user id.", "filter[user]"))
    if problems:
        raise InvalidInput(problems)
    return status, kind, user


_SORT_COLUMNS: dict[str, Sortable] = {
    "createdAt": Flow.created_at,
    "updatedAt": Flow.updated_at,
    "name": Flow.name,
}


class Listed(NamedTuple):
    """A page of flows, how many the list selects, and whether that total is exact (lists with
    ``search`` or ``filter[user]`` count up to ``listing.TOTAL_BOUND`` past the page's start;
    the others read counts kept with the flows, always exact)."""

    rows: Sequence[Flow | Row]
    total: int
    exact: bool


async def list_flows(db: Database, principal: Principal, lq: ListQuery) -> Listed:
    principal.require(perms.FLOWS_READ)
    status, kind, user = _flow_filters(lq.filters)
    if not lq.search and user is None:
        rows, total = await _counted_list(db, principal, lq, status, kind)
        return Listed(rows, total, True)
    plain = not (lq.sort or status or kind or user)
    if lq.search and plain and keyed_search(db.engine.dialect.name, lq.search):
        return await _searched_list(db, principal, lq)
    async with db.read() as session:
        return await _matched_list(session, principal, lq, status, kind, user)


async def _searched_list(db: Database, principal: Principal, lq: ListQuery) -> Listed:
    """A plain search on SQLite: the search index's keys walked in id order, each checked for
    visibility, stopping at the bound; the page's rows and the count read in one statement
    (``listing.keyed_search_page``). A member's candidates are checked against the set of its
    flows (built once, ~1.2 us an entry) or each by primary key (~6.5 us a candidate),
    whichever the counts say is cheaper: the flow counts give the set's size, the search index
    how many candidates there are (counted up to ``_CANDIDATE_ROWS``). At 100,000 flows a
    member's search of a word in 4.4 % of them took 37 ms by probes and 22 by the set; of a
    rare one (22 candidates), 2.8 ms by probes and 18 by the set."""
    assert lq.search
    member = not principal.is_admin
    params = keyed_search_params(lq.search, offset=lq.offset, size=lq.size)
    by_set = False
    if member:
        params.update(_viewer_params(principal))
        seen, _every = await counts.totals(db, principal)
        found = await _SEARCH_CANDIDATES.rows(db, {**params, "candidate_rows": _CANDIDATE_ROWS}, inline=False)
        by_set = seen < _PROBE_OVER_SET * found[0].candidates
    page, counted = _searched_page(member=member, tenant="vis_tenant" in params, by_set=by_set)
    # Off the loop's thread: the walk reads up to ~1,000 index entries (~2 ms).
    rows = await page.rows(db, params, inline=False)
    read = rows[0].matched if rows else (await counted.rows(db, params, inline=False))[0].matched
    return Listed(rows, *bounded_count(read, offset=lq.offset, size=lq.size))


# A member's search: how many of the index's candidates are counted to choose how visibility is
# checked, and how many set entries one candidate's probe costs (measured: ~6.5 against ~1.2 us).
_CANDIDATE_ROWS = 2_500
_PROBE_OVER_SET = 5
_SEARCH_CANDIDATES = Fetch(keyed_search_candidates(SEARCH_TABLE))


@functools.cache
def _searched_page(*, member: bool, tenant: bool, by_set: bool) -> tuple[Fetch, Fetch]:
    """``_searched_list``'s statements for one shape of caller: the page's rows (each with how
    many matches were read), and that count alone for an empty page."""
    where_id = None
    if member:
        viewer = _BoundViewer(tenant=tenant)
        if by_set:
            where_id = functools.partial(owned_set_clause, viewer)
        else:
            where_id = functools.partial(owned_clause, viewer, per_row=True)
    page_ids, count = keyed_search_page(SEARCH_TABLE, where_id)
    flows = Flow.__table__
    rows = sa.select(*_SHOWN, count.label("matched")).where(flows.c.id.in_(page_ids)).order_by(flows.c.id)
    return Fetch(rows), Fetch(sa.select(count.label("matched")))


async def _matched_list(
    session: AsyncSession,
    principal: Principal,
    lq: ListQuery,
    status: FlowStatus | None,
    kind: str | None,
    user: str | None,
) -> Listed:
    """A search or ``filter[user]`` (any filter, sort or database): what matches is selected
    in the list's order up to ``bounded_rows``, which gives the page and its bounded total at
    once (docs/api.md "Totals of the lists"): its cost stops growing with what matches."""
    where: list[sa.ColumnElement[bool]] = [visible_clause(principal)]
    if status is not None:
        where.append(Flow.status == status)
    if kind is not None:
        where.append(Flow.type == kind)
    if user is not None:
        where.append(
            Flow.id.in_(
                sa.select(FlowOwner.flow_id).where(FlowOwner.owner_type == "user", FlowOwner.owner_id == user)
            )
        )
    if lq.search:
        # First: on SQLite the first `id IN (...)` drives the lookup, and a search is
        # usually narrower than visibility (no match: 0.1 ms instead of 15 ms for a member).
        where.insert(
            0,
            search_clause(
                dialect_name(session),
                lq.search,
                id_col=Flow.id,
                name_lc=Flow.name_lc,
                description_lc=Flow.description_lc,
                fts_table=SEARCH_TABLE,
            ),
        )
    # Deferred join: the page's ids first, then only those rows are read. Without it the
    # database sorts whole rows (graph JSON included) of everything that matches before
    # keeping a page: 35k active flows sorted by updatedAt took ~180 ms instead of ~80 ms on
    # SQLite (bench/api.py). What matches is a materialized CTE, planned apart from the order:
    # PostgreSQL otherwise walks the primary key in id order testing each row (a member's
    # search at 100,000 flows: 92 ms against 15 ms, in process, the trigram index then used).
    # On SQLite a search shorter than a trigram is a scan with no index to drive it: left
    # unmaterialized, SQLite reads in the list's order and stops at the bound (an
    # administrator's "sh" at 100,000 flows read every flow before; bench/search.py).
    sort = _SORT_COLUMNS[lq.sort.lstrip("-")] if lq.sort else None
    matching = sa.select(Flow.id, *([sort] if sort is not None else [])).where(*where).cte("matching")
    dialect = dialect_name(session)
    if not (lq.search and dialect == "sqlite" and not keyed_search(dialect, lq.search)):
        matching = matching.prefix_with("MATERIALIZED")

    def in_order(of: Any) -> list[sa.UnaryExpression[Any]]:
        """The list's order over ``of``'s columns (the CTE's, then the bounded read's)."""
        by = {name: of.c[str(col.key)] for name, col in _SORT_COLUMNS.items() if col is sort}
        return order_by(lq.sort, by, of.c.id)

    # What matches, in the list's order, up to the bound; then the page's ids and how many were
    # read, in one statement that returns the page's ids only; then those flows.
    need = bounded_rows(lq.offset, lq.size)
    read = matching.select().order_by(*in_order(matching)).limit(need).subquery("read")
    page = sa.select(read.c.id, sa.func.count().over()).order_by(*in_order(read))
    picked = (await session.execute(page.limit(lq.size).offset(lq.offset))).all()
    n = picked[0][1] if picked else await session.scalar(sa.select(sa.func.count()).select_from(read)) or 0
    total, exact = bounded_count(n, offset=lq.offset, size=lq.size)
    if not picked:
        return Listed([], total, exact)
    flows = sa.select(Flow).where(Flow.id.in_([row[0] for row in picked]))
    flows = flows.order_by(*order_by(lq.sort, _SORT_COLUMNS, Flow.id))
    return Listed((await session.scalars(flows)).all(), total, exact)


async def _counted_list(
    db: Database, principal: Principal, lq: ListQuery, status: str | None, kind: str | None
) -> tuple[Sequence[Row], int]:
    """A list without a search or filter[user]: its total from the counts kept with the flows
    (flows/counts.py: a few counter rows whatever the catalogue's size), read first (an empty
    or past-the-end page reads nothing else); its page by a statement built once per shape.
    Both run on the driver (``fast.Fetch``), with no ORM session: the counts and a page near
    the start (a few index entries) on the calling thread, a deeper page on a pooled
    connection's thread."""
    total, everyone = await counts.totals(db, principal, status=status, type=kind)
    if total == 0 or lq.offset >= total:
        return [], total
    member = not principal.is_admin
    per_row = by_set = False
    if member and (lq.sort or status or kind):
        # A member's page in the sort's index order: each row read checked for visibility
        # by primary key while few rows are read before the page is full, else against the
        # set of the caller's flows built once. The counts say which: reading the page at
        # the visible flows' density costs ~(offset + size) * all / visible probes, the set
        # ~visible entries (a member of a large tenant: probes; of a small one: the set).
        per_row = (lq.offset + lq.size) * everyone < total * total
        by_set = not per_row
    params: dict[str, Any] = {
        "page_limit": lq.size,
        "page_offset": lq.offset,
        "page_end": lq.offset + lq.size,
    }
    if member:
        params.update(_viewer_params(principal))
    if status is not None:
        params["f_status"] = status
    if kind is not None:
        params["f_type"] = kind
    page = _counted_page(
        member=member,
        tenant="vis_tenant" in params,
        status=status is not None,
        kind=kind is not None,
        sort=lq.sort,
        per_row=per_row,
        bounded_ranges=not db.is_sqlite,
    )
    # On the loop's thread only when the statement reads about offset + size index entries; the
    # set of a member's flows (up to ~10,000 entries) is built on a pooled connection's thread.
    inline = lq.offset + lq.size <= INLINE_PAGE_ROWS and not by_set
    return await page.rows(db, params, inline=inline), total


# How deep a counted list's page may start and still be read on the event loop's thread: the
# statement reads about offset + size index entries (~0.15 ms at 1,000 on SQLite).
INLINE_PAGE_ROWS = 1_000


@functools.cache
def _counted_page(
    *,
    member: bool,
    tenant: bool,
    status: bool,
    kind: bool,
    sort: str | None,
    per_row: bool,
    bounded_ranges: bool,
) -> Fetch:
    """The page statement of ``_counted_list`` for one shape of caller, filters and sort, with
    its values as bind parameters: built (and compiled) once, not per request (building it
    cost more CPU than running it)."""
    viewer = _BoundViewer(tenant=tenant) if member else None
    limit = sa.bindparam("page_limit", type_=sa.Integer)
    offset = sa.bindparam("page_offset", type_=sa.Integer)
    order = order_by(sort, _SORT_COLUMNS, Flow.id)
    page_ids: sa.Select[Any] | sa.CompoundSelect[Any]
    if viewer is not None and not (sort or status or kind):
        end = sa.bindparam("page_end", type_=sa.Integer) if bounded_ranges else None
        page_ids = _visible_id_page(viewer, limit=limit, offset=offset, end=end)
    else:
        where: list[sa.ColumnElement[bool]] = []
        if viewer is not None:
            where.append(owned_clause(viewer, Flow.id, per_row=True) if per_row else visible_clause(viewer))
        if status:
            where.append(Flow.status == sa.bindparam("f_status", type_=sa.String))
        if kind:
            where.append(Flow.type == sa.bindparam("f_type", type_=sa.String))
        page_ids = sa.select(Flow.id).where(*where).order_by(*order).limit(limit).offset(offset)
    return Fetch(sa.select(*_SHOWN).where(Flow.id.in_(page_ids)).order_by(*order))


def _owners_for(
    principal: Principal | None, owners: list[dict[str, str]], tenant: str | None, *, add_caller: bool
) -> list[dict[str, str]]:
    out = list(owners)
    extra = []
    if add_caller and principal is not None:
        extra.append({"id": principal.user_id, "type": "user"})
        if principal.tenant_id:
            extra.append({"id": principal.tenant_id, "type": "tenant"})
    if tenant:
        extra.append({"id": tenant, "type": "tenant"})
    for owner in extra:
        if owner not in out:
            out.append(owner)
    return out


def _check_tenant(principal: Principal, tenant: str | None) -> None:
    if tenant is not None and not principal.is_admin and tenant != principal.tenant_id:
        raise Forbidden("You can only assign flows to your own tenant.")


def _check_tenant_owners(
    principal: Principal, owners: list[dict[str, str]], kept: list[dict[str, str]] | None = None
) -> None:
    """A tenant owner makes the flow visible (and editable) in that tenant, so naming another
    tenant there is as forbidden as in ``tenant``. Entries already stored (an admin may have
    shared the flow) stay allowed."""
    for owner in owners:
        if owner["type"] == "tenant" and (kept is None or owner not in kept):
            _check_tenant(principal, owner["id"])


async def check_user_owners(
    session: AsyncSession,
    principal: Principal,
    owners: Sequence[dict[str, str]],
    kept: Sequence[dict[str, str]] | None = None,
) -> None:
    """A user owner sees and may edit the flow, and the flow's executions, counts and logs
    are charged to its first user owner, so a non-admin names only users it may name
    (``iam.policy.may_name_owner``): a tenantless user only itself, a tenant member itself
    and the users of its tenant. An id that is no local user is refused too (it would take
    the flow's executions, counts and logs to an identity nobody can check). Entries already
    stored (an administrator may have added them) stay allowed."""
    if principal.is_admin:
        return
    wanted = {
        o["id"]
        for o in owners
        if o["type"] == "user" and o["id"] != principal.user_id and (kept is None or o not in kept)
    }
    if not wanted:
        return
    rows = await session.execute(sa.select(User.id, User.tenant_id).where(User.id.in_(sorted(wanted))))
    tenant_of = {uid: tenant for uid, tenant in rows}
    outside = sorted(
        uid
        for uid in wanted
        if uid not in tenant_of or not policy.may_name_owner(principal, uid, tenant_of[uid])
    )
    if outside:
        raise Forbidden(f"You can only add yourself or users of your tenant as owners: {', '.join(outside)}.")


# -- credentials: a flow names only secrets its owners may use (secrets.usable_clause) ----------


def _credential_nodes(graph: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(index, node id, credentials id) of every node of a validated (flat) graph naming a secret."""
    return [
        (i, str(node.get("id")), node["credentials_id"])
        for i, node in enumerate(graph.get("nodes") or [])
        if isinstance(node, dict) and isinstance(node.get("credentials_id"), str)
    ]


async def credential_problems(
    session: AsyncSession, graph: dict[str, Any], *, tenant: str | None, owners: Sequence[dict[str, str]]
) -> list[Problem]:
    """One problem per node whose ``credentials_id`` is unknown or not usable by a flow of
    this tenant and these owners (an unknown secret and another tenant's read the same)."""
    nodes = _credential_nodes(graph)
    if not nodes:
        return []
    bad = await secrets.unusable(
        session, [cid for _i, _n, cid in nodes], tenant=tenant, owner_user=owner_user_of(owners)
    )
    return [
        Problem(
            f"graph.nodes[{i}].credentials_id: node {node_id!r}: credentials {cid}: {bad[cid]}",
            f"graph.nodes[{i}].credentials_id",
        )
        for i, node_id, cid in nodes
        if cid in bad
    ]


async def check_new_flow(session: AsyncSession, principal: Principal, flow: Flow) -> None:
    """What a new flow needs the database for: its user owners may be named by the caller and
    its nodes' credentials are usable by its owners (create, array create, from a template)."""
    await check_user_owners(session, principal, flow.owners)
    problems = await credential_problems(session, flow.graph, tenant=flow.tenant, owners=flow.owners)
    problems += await error_flow_problems(session, principal, flow.id, flow.owners, flow.error_flow_id)
    problems += await subflow_problems(session, principal, flow.id, flow.tenant, flow.owners, flow.graph)
    if problems:
        raise InvalidInput(problems)


async def error_flow_problems(
    session: AsyncSession,
    principal: Principal,
    flow_id: str,
    owners: list[dict[str, str]],
    error_flow_id: str | None,
) -> list[Problem]:
    """``errorFlowId`` (SPEC §11) names another flow that the caller sees and that shares an
    owner (a user or a tenant) with this flow, so its owners see it too. Whether it is active
    is checked when it is started (a flow and its error flow are often saved before either
    starts)."""
    if error_flow_id is None:
        return []
    if error_flow_id == flow_id:
        return [Problem("must name another flow, not this one", "errorFlowId")]
    target = await session.scalar(sa.select(Flow).where(Flow.id == error_flow_id))
    if target is None or not is_visible(principal, target) or not shares_owner(owners, target.owners):
        return [Problem("must name a flow this flow's owners can see", "errorFlowId")]
    return []


# How many flows the cycle search of a save reads at most (a tenant's call graph is small; this
# bounds the work an author can cause; a cycle past it is stopped by the depth limit at run time).
_CYCLE_SEARCH_FLOWS = 1000


def _flow_calls(graph: Any) -> list[tuple[int, str, str]]:
    """(index, node id, flowId) of each ``flow`` node of a graph naming a well-formed id."""
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    out = []
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        if not isinstance(node, dict) or node.get("componentId") != "flow":
            continue
        fields = node.get("fields")
        target = fields.get("flowId") if isinstance(fields, dict) else None
        if isinstance(target, str) and ids.is_valid_id(target):
            out.append((i, str(node.get("id")), target))
    return out


async def subflow_problems(
    session: AsyncSession,
    principal: Principal,
    flow_id: str,
    tenant: str | None,
    owners: Sequence[dict[str, str]],
    graph: Any,
) -> list[Problem]:
    """Each ``flow`` node (SPEC §12) names a flow of this flow's tenant that the caller sees and
    that shares an owner with this flow (so its owners see it), the same answer for a flow that
    does not exist, another tenant's or an unseen one; and no cycle of flows calling each other
    goes through this flow, as far as the caller can see (400 listing the cycle). The queue
    checks the same again when the step runs (queue/subflows.py)."""
    calls = _flow_calls(graph)
    if not calls:
        return []
    problems: list[Problem] = []
    targets = {
        f.id: f
        for f in (
            await session.scalars(sa.select(Flow).where(Flow.id.in_({t for _i, _n, t in calls} - {flow_id})))
        ).all()
    }
    for i, node_id, target_id in calls:
        path = f"graph.nodes[{i}].fields.flowId"
        if target_id == flow_id:
            problems.append(
                Problem(f"{path}: flows calling each other form a cycle: {flow_id} → {flow_id}", path)
            )
            continue
        target = targets.get(target_id)
        if (
            target is None
            or target.tenant != tenant
            or not is_visible(principal, target)
            or not shares_owner(owners, target.owners)
        ):
            problems.append(Problem(f"{path}: {flow_refusal(target_id)} (node {node_id!r})", path))
            continue
        cycle = await _call_cycle(session, principal, flow_id, target)
        if cycle:
            text = " → ".join([flow_id, *cycle])
            problems.append(Problem(f"{path}: flows calling each other form a cycle: {text}", path))
    return problems


async def _call_cycle(session: AsyncSession, principal: Principal, flow_id: str, start: Flow) -> list[str]:
    """The calls from ``start`` back to ``flow_id`` through flows the caller sees (depth first),
    as the flow ids from ``start`` to ``flow_id``; empty when there is none."""
    paths: dict[str, list[str]] = {start.id: [start.id]}
    todo = [start]
    read = 0
    while todo and read < _CYCLE_SEARCH_FLOWS:
        current = todo.pop()
        read += 1
        next_ids = [t for _i, _n, t in _flow_calls(current.graph)]
        if flow_id in next_ids:
            return [*paths[current.id], flow_id]
        unseen = [t for t in next_ids if t not in paths]
        if not unseen:
            continue
        for f in (await session.scalars(sa.select(Flow).where(Flow.id.in_(unseen)))).all():
            if f.id in paths or not is_visible(principal, f):
                continue
            paths[f.id] = [*paths[current.id], f.id]
            todo.append(f)
    return []


async def start_problems(session: AsyncSession, flow: Flow, registry: Registry) -> list[Problem]:
    """Why a saved flow cannot start now, checked again at ``POST /start`` because the answer
    can change after the save: its components must still be installed (validated against
    today's registry) and its secrets still usable by its owners (one may have been deleted)."""
    body = {name: getattr(flow, name) for name in _MUTABLE}
    _clean, problems = validate_flow_body(
        {k: v for k, v in body.items() if v is not None or k in ("name", "graph", "type")},
        registry=registry,
        saving=False,
    )
    problems += await credential_problems(session, flow.graph, tenant=flow.tenant, owners=flow.owners)
    if flow.error_flow_id is not None:
        # Its error flow may have been deleted, or its owners changed, since the save. Whether it
        # is active is judged when it is started (two flows may name each other).
        target = await session.scalar(sa.select(Flow).where(Flow.id == flow.error_flow_id))
        if target is None or not shares_owner(flow.owners, target.owners):
            problems.append(
                Problem("errorFlowId: no longer a flow this flow's owners can see", "errorFlowId")
            )
    return problems


Sealer = Callable[[str], str]
"""Encrypts a webhook secret for storage (the service's ``SecretBox.seal``, as credentials are
stored); the webhook door opens it (``webhooks.service.WebhookLimits.webhook_secret``)."""


def _sealed(secret: str | None, seal: Sealer | None) -> str | None:
    if secret is None:
        return None
    if seal is None:
        raise RuntimeError("a webhook secret can only be stored sealed: no key was given")
    return seal(secret)


def _apply(flow: Flow, clean: dict[str, Any], seal: Sealer | None) -> None:
    flow.name = clean["name"]
    flow.name_lc = clean["name"].lower()
    flow.description = clean["description"]
    flow.description_lc = clean["description"].lower() if clean["description"] else None
    flow.tenant = clean["tenant"]
    flow.type = clean["type"]
    flow.cron = clean["cron"]
    flow.graph = clean["graph"]
    flow.owners = clean["owners"]
    if "webhookSecret" in clean:
        flow.webhook_secret = _sealed(clean["webhookSecret"], seal)
    flow.error_flow_id = clean.get("errorFlowId")


async def _write_owners(
    session: AsyncSession, flow_id: str, owners: list[dict[str, str]], *, replace: bool
) -> list[tuple[str, str]]:
    """Write the flow's ``flow_owners`` entries; with ``replace``, the ones they replace first
    (returned: the counts move from them)."""
    before: list[tuple[str, str]] = []
    if replace:
        before = await _delete_owners(session, flow_id)
    if owners:
        await session.execute(
            sa.insert(FlowOwner),
            [{"flow_id": flow_id, "owner_type": o["type"], "owner_id": o["id"]} for o in owners],
        )
    return before


async def _delete_owners(session: AsyncSession, flow_id: str) -> list[tuple[str, str]]:
    deleted = await session.execute(
        sa.delete(FlowOwner)
        .where(FlowOwner.flow_id == flow_id)
        .returning(FlowOwner.owner_type, FlowOwner.owner_id)
        .execution_options(synchronize_session=False)
    )
    return [(t, i) for t, i in deleted.all()]


def require_create(principal: Principal) -> None:
    """Creating flows (one, or a batch before its items are looked at) needs this."""
    principal.require(perms.FLOWS_CREATE)


def prepare_new_flow(principal: Principal, body: Any, registry: Registry, seal: Sealer | None = None) -> Flow:
    """Validate a create body and build the (unsaved) flow; InvalidInput lists every problem."""
    principal.require(perms.FLOWS_CREATE)
    clean, problems = validate_flow_body(body, registry=registry)
    if problems:
        raise InvalidInput(problems)
    if clean["tenant"] is None:
        clean["tenant"] = principal.tenant_id
    _check_tenant(principal, clean["tenant"])
    _check_tenant_owners(principal, clean["owners"])
    clean["owners"] = _owners_for(principal, clean["owners"], clean["tenant"], add_caller=True)
    now = utcnow()
    flow = Flow(
        id=new_id(),
        status=FlowStatus.INACTIVE,
        status_changed_at=now,
        version=1,
        created_at=now,
        updated_at=now,
        created_by=principal.user_id,
    )
    _apply(flow, clean, seal)
    return flow


async def insert_flows(session: AsyncSession, flows: Sequence[Flow]) -> None:
    for flow in flows:
        flow.history_version = 1
    session.add_all(flows)
    await session.flush()
    for flow in flows:
        await _write_owners(session, flow.id, flow.owners, replace=False)
    await counts.shift(session, after=[counts.Shape.new(flow) for flow in flows])
    await history.record_first(session, flows)


# The fields a PATCH body may give (each the same-named attribute of the flow).
_MUTABLE = ("name", "description", "tenant", "graph", "type", "cron", "owners")


def _merge_patch(flow: Flow, patch: Any) -> dict[str, Any]:
    if not isinstance(patch, dict):
        raise InvalidInput("The body must be a JSON object.")
    current: dict[str, Any] = {name: getattr(flow, name) for name in _MUTABLE}
    current["errorFlowId"] = flow.error_flow_id
    merged = {**current, **patch}
    return {k: v for k, v in merged.items() if v is not None or k in ("name", "graph", "type")}


async def update_flow(
    session: AsyncSession,
    principal: Principal,
    flow_id: str,
    patch: Any,
    registry: Registry,
    seal: Sealer | None = None,
) -> Flow:
    principal.require(perms.FLOWS_UPDATE)
    flow = await get_flow(session, principal, flow_id, for_update=True)
    _check_editable(flow)
    merged = _merge_patch(flow, patch)
    clean, problems = validate_flow_body(merged, registry=registry, current_status=flow.status)
    if problems:
        raise InvalidInput(problems)
    _check_trigger_kept(flow, clean["graph"], registry)
    if isinstance(patch, dict) and "webhookSecret" not in patch:
        clean.pop("webhookSecret", None)
    if clean["tenant"] != flow.tenant:
        _check_tenant(principal, clean["tenant"])
    _check_tenant_owners(principal, clean["owners"], kept=flow.owners)
    await check_user_owners(session, principal, clean["owners"], kept=flow.owners)
    clean["owners"] = _owners_for(principal, clean["owners"], clean["tenant"], add_caller=False)
    error_problems = await error_flow_problems(
        session, principal, flow.id, clean["owners"], clean.get("errorFlowId")
    )
    error_problems += await subflow_problems(
        session, principal, flow.id, clean["tenant"], clean["owners"], clean["graph"]
    )
    if error_problems:
        raise InvalidInput(error_problems)
    await _check_credentials_kept(session, flow, clean)
    now = utcnow()
    before = history.content(flow)
    after = {**before, "graph": clean["graph"], "cron": clean["cron"]}
    if "errorFlowId" in clean:  # once PATCH can set it (SPEC §11), a change makes a version too
        after["error_flow_id"] = clean["errorFlowId"]
    new_version = flow.history_version + 1 if history.changed(before, after) else flow.history_version
    values: dict[str, Any] = {
        "name": clean["name"],
        "name_lc": clean["name"].lower(),
        "description": clean["description"],
        "description_lc": clean["description"].lower() if clean["description"] else None,
        "tenant": clean["tenant"],
        "type": clean["type"],
        "cron": clean["cron"],
        "graph": clean["graph"],
        "owners": clean["owners"],
        "error_flow_id": clean.get("errorFlowId"),
        "version": flow.version + 1,
        "history_version": new_version,
        "updated_at": now,
        **_schedule(flow, clean["cron"], now),
    }
    if "webhookSecret" in clean:
        values["webhook_secret"] = _sealed(clean["webhookSecret"], seal)
    result = await session.execute(
        sa.update(Flow)
        .where(Flow.id == flow.id, Flow.status == flow.status, Flow.version == flow.version)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict("The flow was changed by another request; read it again and retry.")
    if new_version != flow.history_version:
        await history.record(session, flow.id, new_version, after, author=principal.user_id, at=now)
    replaced = await _write_owners(session, flow.id, clean["owners"], replace=True)
    await counts.shift(
        session,
        before=[counts.Shape(replaced, flow.status, flow.type)],
        after=[counts.Shape(((o["type"], o["id"]) for o in clean["owners"]), flow.status, clean["type"])],
    )
    await session.refresh(flow)
    return flow


# -- editing (SPEC §3): an inactive or an active flow; one rule for PATCH and restore ---------------

_EDITABLE = (FlowStatus.INACTIVE, FlowStatus.ACTIVE)


def _check_editable(flow: Flow) -> None:
    """A flow is changed while inactive or active, never in transit: ``starting`` is being
    checked and subscribed with the graph it had, ``stopping`` is draining."""
    if flow.status not in _EDITABLE:
        raise Conflict(f"Flow is neither inactive nor active. Current status: {flow.status}")


def _trigger_key(graph: Any, registry: Registry) -> Any:
    try:
        node = trigger_node(graph, registry)
    except TriggerProblem as exc:
        return ("problem", str(exc))
    if node is None:
        return None
    fields = orjson.dumps(node.fields, option=orjson.OPT_SORT_KEYS)
    return (node.node_id, node.component.id, node.function, fields, node.credentials_id)


def _check_trigger_kept(flow: Flow, graph: Any, registry: Registry) -> None:
    """An active flow's event trigger (its node, connector, function, fields and credentials)
    stays as it was: the subscription is made when the flow starts (``triggers/lifecycle.py``)
    and is not re-made by a save. Every other node, edge and the schedule may change."""
    if flow.status != FlowStatus.ACTIVE:
        return
    if _trigger_key(flow.graph, registry) != _trigger_key(graph, registry):
        raise Conflict(
            "The event trigger of an active flow cannot change: stop the flow, save the change "
            "and start it again (its subscription is made when it starts).",
            field="graph",
        )


def _schedule(flow: Flow, cron: str | None, now: datetime) -> dict[str, Any]:
    """An active flow whose schedule changes fires next by the new one (from now); one whose
    schedule is removed fires no more. An inactive flow's next run is set when it starts."""
    if flow.status != FlowStatus.ACTIVE or cron == flow.cron:
        return {}
    return {"next_run_at": next_after(cron, now) if cron else None}


async def _check_credentials_kept(session: AsyncSession, flow: Flow, clean: dict[str, Any]) -> None:
    """A PATCH leaves every node's credentials usable by the flow's owners. When the graph's
    secrets were usable before and only the new owners (or tenant) make them unusable, the
    answer says so: the owners change is what is refused."""
    problems = await credential_problems(
        session, clean["graph"], tenant=clean["tenant"], owners=clean["owners"]
    )
    if not problems:
        return
    moved = clean["owners"] != flow.owners or clean["tenant"] != flow.tenant
    if moved and not await credential_problems(
        session, clean["graph"], tenant=flow.tenant, owners=flow.owners
    ):
        raise InvalidInput(
            [
                Problem(
                    "owners: this change would leave the flow's credentials unusable (a secret is "
                    "usable by the flow's tenant, or without a tenant by its first user owner): " + p.message,
                    "owners",
                )
                for p in problems
            ]
        )
    raise InvalidInput(problems)


async def delete_flow(session: AsyncSession, principal: Principal, flow_id: str) -> None:
    principal.require(perms.FLOWS_DELETE)
    flow = await get_flow(session, principal, flow_id, for_update=True)  # locked: its status holds
    if flow.status != FlowStatus.INACTIVE:
        raise Conflict(f"Flow is not inactive. Current status: {flow.status}")
    # The owner entries before the row (which would take them along), and what they were: the
    # counts move from them.
    owners = await _delete_owners(session, flow.id)
    result = await session.execute(
        sa.delete(Flow)
        .where(Flow.id == flow.id, Flow.status == FlowStatus.INACTIVE)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"Flow is not inactive. Current status: {flow.status}")
    await counts.shift(session, before=[counts.Shape(owners, FlowStatus.INACTIVE, flow.type)])
    await history.forget(session, flow.id)


async def transition(
    session: AsyncSession,
    principal: Principal,
    flow_id: str,
    *,
    expected: FlowStatus,
    target: FlowStatus,
    registry: Registry | None = None,
) -> None:
    """start (inactive→starting) and stop (active→stopping), as one conditional UPDATE
    (``flows.status.move``). A start is refused (``409``, every reason listed) when
    ``start_problems`` finds any; the flow stays as it was."""
    principal.require(perms.FLOWS_UPDATE)
    check_id(flow_id)
    flow = await get_flow(session, principal, flow_id)
    if target == FlowStatus.STARTING and registry is not None and flow.status == expected:
        problems = await start_problems(session, flow, registry)
        if problems:
            raise Conflict(problems=[Problem(f"Flow cannot start: {p.message}", p.field) for p in problems])
    if not await move_status(session, flow.id, expected, target, at=utcnow(), message=None):
        current = await session.scalar(sa.select(Flow.status).where(Flow.id == flow.id))
        if current is None:
            raise not_found(flow_id)
        raise Conflict(f"Flow is not {expected}. Current status: {current}")


# -- versions (SPEC §12): reading needs what reading the flow needs; restoring is a change -------


def _version_number(number: int) -> int:
    if number < 1 or number > 2**31 - 1:
        raise InvalidInput("The version must be a positive integer.", field="number")
    return number


async def list_versions(
    session: AsyncSession, principal: Principal, flow_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    """A page of a visible flow's versions, newest first (``tenant.flows.read``)."""
    principal.require(perms.FLOWS_READ)
    flow = await get_flow(session, principal, flow_id)
    rows, total = await history.page(session, flow.id, limit=limit, offset=offset)
    return [history.to_dict(v, current=flow.history_version, full=False) for v in rows], total


async def read_version(
    session: AsyncSession, principal: Principal, flow_id: str, number: int
) -> dict[str, Any]:
    """One version of a visible flow with its content (``tenant.flows.read``)."""
    principal.require(perms.FLOWS_READ)
    flow = await get_flow(session, principal, flow_id)
    version = await history.get(session, flow.id, _version_number(number))
    if version is None:
        raise NotFound(f"Flow {flow_id} has no version {number}.")
    return history.to_dict(version, current=flow.history_version, full=True)


async def restore_version(
    session: AsyncSession, principal: Principal, flow_id: str, number: int, registry: Registry
) -> Flow:
    """A new version equal to version ``number`` (``tenant.flows.update``, like a PATCH: the
    flow must be inactive or active (then with the same event trigger), and the content must
    validate today: components installed, credentials usable by the flow's owners)."""
    principal.require(perms.FLOWS_UPDATE)
    flow = await get_flow(session, principal, flow_id, for_update=True)
    version = await history.get(session, flow.id, _version_number(number))
    if version is None:
        raise NotFound(f"Flow {flow_id} has no version {number}.")
    _check_editable(flow)
    body = {name: getattr(flow, name) for name in _MUTABLE}
    body.update(graph=version.graph, cron=version.cron)
    _clean, problems = validate_flow_body(
        {k: v for k, v in body.items() if v is not None or k in ("name", "graph", "type")},
        registry=registry,
        current_status=flow.status,
    )
    problems += await credential_problems(session, version.graph, tenant=flow.tenant, owners=flow.owners)
    problems += await subflow_problems(session, principal, flow.id, flow.tenant, flow.owners, version.graph)
    if problems:
        raise InvalidInput(problems)
    _check_trigger_kept(flow, version.graph, registry)
    now = utcnow()
    new = history.content(version)
    result = await session.execute(
        sa.update(Flow)
        .where(Flow.id == flow.id, Flow.status == flow.status, Flow.version == flow.version)
        .values(
            graph=version.graph,
            cron=version.cron,
            error_flow_id=version.error_flow_id,
            version=flow.version + 1,
            history_version=flow.history_version + 1,
            updated_at=now,
            **_schedule(flow, version.cron, now),
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict("The flow was changed by another request; read it again and retry.")
    await history.record(
        session,
        flow.id,
        flow.history_version + 1,
        new,
        author=principal.user_id,
        at=now,
        restored_from=version.number,
    )
    await session.refresh(flow)
    return flow


# -- export / import (SPEC §12): reading a flow's document needs what reading the flow needs ----


async def export_flow(session: AsyncSession, principal: Principal, flow_id: str) -> dict[str, Any]:
    principal.require(perms.FLOWS_READ)
    flow = await get_flow(session, principal, flow_id)
    return await portable.export_document(session, flow)


async def import_flow(
    session: AsyncSession, principal: Principal, raw: bytes | str, registry: Registry
) -> Flow:
    """A new flow of the caller from a document; ``InvalidInput`` lists every problem (of the
    document, of the flow as validated here, each credential name missing or ambiguous for the
    caller) and nothing is stored."""
    principal.require(perms.FLOWS_CREATE)
    doc, problems = portable.parse(raw)
    if problems:
        raise InvalidInput(problems)
    body, names, problems = portable.to_body(doc)
    _clean, invalid = validate_flow_body(body, registry=registry)
    problems += invalid
    ids, missing = await portable.resolve_names(
        session, names, tenant=principal.tenant_id, owner_user=principal.user_id
    )
    problems += missing
    if problems:
        raise InvalidInput(problems)
    for i, cid in ids.items():
        body["graph"]["nodes"][i]["credentials_id"] = cid
    flow = prepare_new_flow(principal, body, registry)
    await check_new_flow(session, principal, flow)
    await insert_flows(session, [flow])
    return flow
