"""Flow lists page for page equal the documented rule, on SQLite and PostgreSQL, for random
owners, statuses, ties, sorts and searches: totals from the kept counts (flows/counts.py) or a
window count (search), a tenant member's plain page from the visibility index alone
(``_visible_id_page``: a merge of each owner key's index range), a filtered or sorted one with
a probe per row or the set of the member's flows (both are reached: page sizes 1 to 1000);
page N of each must be exactly the slice the rule gives, and the total the rule's count.
Another tenant's flows never appear."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from flowyard.api.listing import ListQuery
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.flows import service as flows
from flowyard.iam.principal import Principal
from tests.conftest import flow_body

ADMIN = Principal("a" * 24, "admin@example.com", None, frozenset({"all"}), "")
T1, T2 = "1" * 24, "2" * 24
MEMBER = Principal("b" * 24, "m@example.com", T1, frozenset({"tenant.flows.read"}), "")
TENANTLESS = Principal("c" * 24, "t@example.com", None, frozenset({"tenant.flows.read"}), "")
OTHER = "d" * 24
OWNER_SETS = [
    [("user", MEMBER.user_id)],
    [("tenant", T1)],
    [("user", MEMBER.user_id), ("tenant", T1)],
    [("tenant", T2)],
    [("user", OTHER)],
    [("user", OTHER), ("tenant", T1)],
    [("user", TENANTLESS.user_id)],
    [("user", TENANTLESS.user_id), ("user", MEMBER.user_id), ("tenant", T2)],
]
# Single letters sort alike under every collation; "shop" is searched through the index.
NAMES = ["a", "b", "c", "d", "e", "shop a", "b SHOP", "shopify", "sh"]
SEARCHES = [None, "shop", "sh", "SHOPIFY", "zzz"]
SORTS = [None, "name", "-name", "updatedAt", "-updatedAt", "-createdAt"]
COLUMN = {"name": "name", "updatedAt": "updated_at", "createdAt": "created_at"}


def _expected(rows: list[dict[str, Any]], principal: Principal, lq: ListQuery) -> list[str]:
    keys = set(principal.owner_keys())
    seen = [r for r in rows if keys & r["owners"]]
    if lq.search:
        needle = lq.search.lower()
        seen = [r for r in seen if needle in r["name"].lower() or needle in r["description"].lower()]
    if "status" in lq.filters:
        seen = [r for r in seen if r["status"] == lq.filters["status"]]
    seen.sort(key=lambda r: r["id"])
    if lq.sort:
        seen.sort(key=lambda r: r[COLUMN[lq.sort.lstrip("-")]], reverse=lq.sort.startswith("-"))
    return [r["id"] for r in seen]


async def test_pages_equal_the_rule_for_random_owners_and_sorts(db: Database, registry: Registry) -> None:
    rng = random.Random(8)
    base = utcnow() - timedelta(days=1)
    made, rows = [], []
    for _ in range(70):
        owners = rng.choice(OWNER_SETS)
        body = flow_body(rng.choice(NAMES), owners=[{"type": t, "id": i} for t, i in owners])
        flow = flows.prepare_new_flow(ADMIN, body, registry)
        flow.status = rng.choice(["active", "inactive"])
        flow.updated_at = base + timedelta(seconds=rng.randrange(20))  # ties on purpose
        flow.created_at = base - timedelta(seconds=rng.randrange(20))
        made.append(flow)
        rows.append(
            {
                "id": flow.id,
                "name": flow.name,
                "description": flow.description,
                "status": flow.status,
                "updated_at": flow.updated_at,
                "created_at": flow.created_at,
                "owners": {(o["type"], o["id"]) for o in flow.owners},
            }
        )
    async with db.write() as session:
        await flows.insert_flows(session, made)
    async with db.read() as session:
        for principal in (MEMBER, TENANTLESS, ADMIN):
            for sort, filters, search in [
                *((sort, filters, None) for sort in SORTS for filters in ({}, {"status": "active"})),
                *((None, {}, search) for search in SEARCHES),
                ("-name", {"status": "active"}, "shop"),
            ]:
                expected = _expected(rows, principal, ListQuery(sort=sort, filters=filters, search=search))
                for size in (1, 3, 7, 1000):
                    pages = len(expected) // size + 2  # one past the end too
                    for number in range(1, pages + 1):
                        lq = ListQuery(page=number, size=size, sort=sort, filters=filters, search=search)
                        found, total, exact = await flows.list_flows(db, principal, lq)
                        assert exact
                        where = (principal.username, sort, filters, search, size, number)
                        assert total == len(expected), where
                        assert [f.id for f in found] == expected[lq.offset : lq.offset + size], where
    member_sees = set(_expected(rows, MEMBER, ListQuery()))
    assert member_sees
    for r in rows:
        if r["owners"] <= {("tenant", T2), ("user", OTHER), ("user", TENANTLESS.user_id)}:
            assert r["id"] not in member_sees
