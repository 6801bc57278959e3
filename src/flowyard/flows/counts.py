"""How many flows each caller sees, kept as counts in the transactions that change flows, so a
list's ``meta.total`` is a few counter rows, never a count of thousands of flows (issue 19).

A flow is visible to a caller through its owner entries (``flows.service``: the one rule), so
the counts are kept per *scope* of owner entries, and per ``status`` and ``type`` (the list's
filters), in ``flow_counts``:

- ``('', '')``: every flow (an administrator's lists);
- ``(u, '')``: the flows with the owner entry ``user u``;
- ``('', t)``: the flows with the owner entry ``tenant t``;
- ``(u, t)``: the flows with both, so that a member of ``t`` (who sees ``user u`` or
  ``tenant t``) is counted ``n(u, '') + n('', t) - n(u, t)``, each flow once.

Owner ids are never empty (``flows.validation``), so ``''`` names no owner.

Written only here, through :func:`shift`, by the flows module's writers: ``insert_flows``,
``update_flow`` (owners, type), ``delete_flow`` and ``flows.status.move``; each shift is one
sorted upsert (``db.dialect.increment``: concurrent writers on PostgreSQL lock counter rows in
one order) in the writer's own transaction, so a committed flow is always counted and a rolled
back one never. Migration 0022 filled the table from the flows there were; :func:`drift` tells
whether the table still agrees with the flows (``flowyard check``), :func:`recount` rebuilds it
(``flowyard check --recount``) after a write that bypassed this module (an edit by hand).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.db import dialect
from flowyard.db.fast import Fetch
from flowyard.flows.models import FlowCount, FlowOwner

if TYPE_CHECKING:
    from flowyard.db.session import Database
    from flowyard.iam.principal import Principal

ANY = ""

Scope = tuple[str, str]


class Shape:
    """What a flow is counted by: its owner entries (``(type, id)``, as ``flow_owners`` holds
    them: the visibility index, which the counts follow), status and type."""

    __slots__ = ("owners", "status", "type")

    def __init__(self, owners: Iterable[tuple[str, str]], status: str, type: str) -> None:
        self.owners = tuple((str(t), str(i)) for t, i in owners)
        self.status = str(status)
        self.type = str(type)

    @classmethod
    def new(cls, flow: Any) -> Shape:
        """A flow about to be inserted: its validated owners, the entries ``flow_owners`` gets."""
        return cls(((o["type"], o["id"]) for o in flow.owners), flow.status, flow.type)


async def owner_entries(session: AsyncSession, flow_id: str) -> list[tuple[str, str]]:
    """A stored flow's owner entries, from ``flow_owners`` (not the ``owners`` JSON, which a
    quarantined cell may have replaced)."""
    o = FlowOwner.__table__.c
    rows = await session.execute(sa.select(o.owner_type, o.owner_id).where(o.flow_id == flow_id))
    return [(t, i) for t, i in rows.all()]


def scopes(owners: Iterable[tuple[str, str]]) -> set[Scope]:
    """The scopes one flow with these owner entries is counted in."""
    users = {i for t, i in owners if t == "user"}
    tenants = {i for t, i in owners if t == "tenant"}
    out: set[Scope] = {(ANY, ANY)}
    out.update((u, ANY) for u in users)
    out.update((ANY, t) for t in tenants)
    out.update((u, t) for u in users for t in tenants)
    return out


async def shift(
    session: AsyncSession,
    *,
    before: Sequence[Shape] = (),
    after: Sequence[Shape] = (),
) -> None:
    """Count the flows of ``after`` and uncount those of ``before`` (a flow that changed is in
    both), in the caller's transaction."""
    deltas: Counter[tuple[str, str, str, str]] = Counter()
    for shapes, sign in ((before, -1), (after, 1)):
        for shape in shapes:
            for user, tenant in scopes(shape.owners):
                deltas[(user, tenant, shape.status, shape.type)] += sign
    rows = [
        {"user_id": u, "tenant": t, "status": s, "type": ty, "n": n}
        for (u, t, s, ty), n in deltas.items()
        if n
    ]
    await dialect.increment(session, FlowCount, ("user_id", "tenant", "status", "type"), "n", rows)


@functools.cache
def _totals_statement(kind: str, by_status: bool, by_type: bool) -> sa.Select[int, int]:
    """How many flows a caller of ``kind`` sees and how many there are, of the status and type
    given (or any): one statement, built once per shape, its values bind parameters. ``kind``:
    ``all`` (an administrator sees every flow), ``user`` (a caller without a tenant sees the
    flows with its user entry) or ``member`` (its user entry or its tenant's, the flows with
    both taken off once)."""
    c = FlowCount.__table__.c
    user = sa.bindparam("count_user", type_=sa.String)
    tenant = sa.bindparam("count_tenant", type_=sa.String)
    every: Any = (ANY, ANY)
    signed: list[tuple[Any, int]] = {
        "all": [(every, 1)],
        "user": [((user, ANY), 1)],
        "member": [((user, ANY), 1), ((ANY, tenant), 1), ((user, tenant), -1)],
    }[kind]

    def sum_of(terms: list[tuple[Any, int]]) -> sa.ColumnElement[int]:
        term = sa.case(*[((c.user_id == u) & (c.tenant == t), c.n * sign) for (u, t), sign in terms], else_=0)
        return sa.func.coalesce(sa.func.sum(term), 0)

    scopes = [scope for scope, _ in signed] + ([every] if kind != "all" else [])
    where: list[sa.ColumnElement[bool]] = [sa.or_(*[(c.user_id == u) & (c.tenant == t) for u, t in scopes])]
    if by_status:
        where.append(c.status == sa.bindparam("count_status", type_=sa.String))
    if by_type:
        where.append(c.type == sa.bindparam("count_type", type_=sa.String))
    return sa.select(sum_of(signed).label("seen"), sum_of([(every, 1)]).label("every")).where(*where)


async def totals(
    db: Database,
    principal: Principal | None,
    *,
    status: str | None = None,
    type: str | None = None,
) -> tuple[int, int]:
    """(how many flows the caller sees, how many there are) of this status and type (None:
    any); ``principal`` None: every flow."""
    params: dict[str, str] = {}
    if principal is None or principal.is_admin:
        kind = "all"
    else:
        keys = dict(principal.owner_keys())
        params["count_user"] = keys["user"]
        kind = "user"
        if keys.get("tenant"):
            params["count_tenant"] = keys["tenant"]
            kind = "member"
    if status is not None:
        params["count_status"] = status
    if type is not None:
        params["count_type"] = type
    row = (await _totals_read(kind, status is not None, type is not None).all(db, **params))[0]
    return int(row.seen or 0), int(row.every or 0)


@functools.cache
def _totals_read(kind: str, by_status: bool, by_type: bool) -> Fetch:
    """``_totals_statement`` as a point read (a few counter rows by primary key): on SQLite on
    the calling thread, with no session."""
    return Fetch(_totals_statement(kind, by_status, by_type))


# Every counter row, counted from the flows and their owner entries (the rule of ``scopes``).
_RECOUNT = sa.text(
    """
SELECT '' AS user_id, '' AS tenant, f.status, f.type, count(*) AS n FROM flows f GROUP BY f.status, f.type
UNION ALL
SELECT o.owner_id, '', f.status, f.type, count(*)
  FROM flow_owners o JOIN flows f ON f.id = o.flow_id
 WHERE o.owner_type = 'user' GROUP BY o.owner_id, f.status, f.type
UNION ALL
SELECT '', o.owner_id, f.status, f.type, count(*)
  FROM flow_owners o JOIN flows f ON f.id = o.flow_id
 WHERE o.owner_type = 'tenant' GROUP BY o.owner_id, f.status, f.type
UNION ALL
SELECT u.owner_id, t.owner_id, f.status, f.type, count(*)
  FROM flow_owners u
  JOIN flow_owners t ON t.flow_id = u.flow_id AND t.owner_type = 'tenant'
  JOIN flows f ON f.id = u.flow_id
 WHERE u.owner_type = 'user' GROUP BY u.owner_id, t.owner_id, f.status, f.type
"""
).columns(user_id=sa.String, tenant=sa.String, status=sa.String, type=sa.String, n=sa.Integer)

Key = tuple[str, str, str, str]


async def drift(session: AsyncSession) -> dict[Key, tuple[int, int]]:
    """The counter rows that disagree with the flows: key -> (kept, counted)."""
    counted: dict[Key, int] = {
        (u, t, s, ty): int(n) for u, t, s, ty, n in (await session.execute(_RECOUNT)).all()
    }
    c = FlowCount.__table__.c
    kept: dict[Key, int] = {
        (u, t, s, ty): int(n)
        for u, t, s, ty, n in (
            await session.execute(sa.select(c.user_id, c.tenant, c.status, c.type, c.n))
        ).all()
        if n
    }
    return {
        k: (kept.get(k, 0), counted.get(k, 0))
        for k in kept.keys() | counted.keys()
        if kept.get(k, 0) != counted.get(k, 0)
    }


async def recount(session: AsyncSession) -> int:
    """Rebuild the counter rows from the flows, in the caller's write transaction (on
    PostgreSQL the flows are locked against writes until it commits); how many rows differed."""
    if dialect.dialect_name(session) == "postgresql":
        await session.execute(sa.text("LOCK TABLE flows, flow_owners IN SHARE MODE"))
    differed = len(await drift(session))
    await session.execute(sa.delete(FlowCount))
    await session.execute(
        sa.insert(FlowCount).from_select(["user_id", "tenant", "status", "type", "n"], _RECOUNT)
    )
    return differed
