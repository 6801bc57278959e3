"""A flow list with ``search`` (or ``filter[user]``) counts its total up to ``TOTAL_BOUND`` past
the start of the page (docs/api.md "Totals of the lists"), and its pages are still exactly the
documented slices in id order.

On SQLite a plain search walks the search index in key order (migration 0023: an id's creation
second times 2^31 plus a rank within the second) and stops at the bound, reading the rest of
the last second only when the page reaches into it. Flows are made here with ids of a few
seconds, many in the same second, inserted in random order (so key order within a second is
not id order), for an administrator and a tenant member, with the bound set low and a member's
visibility checked both ways (by primary key, against the set of its flows), so every branch
is reached: the page equals the rule's slice, the total is ``min(n, offset + bound)``, and it
is exact exactly when ``n <= offset + bound``. PostgreSQL answers the same through its own
path, and must give the same pages and totals.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowyard.api import listing
from flowyard.api.listing import ListQuery
from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.flows import service as flows
from flowyard.flows.models import Flow
from flowyard.iam.principal import Principal
from tests.conftest import Account, flow_body

ADMIN = Principal("a" * 24, "admin@example.com", None, frozenset({"all"}), "")
T1, T2 = "1" * 24, "2" * 24
MEMBER = Principal("b" * 24, "m@example.com", T1, frozenset({"tenant.flows.read"}), "")
OWNERS = [
    [{"type": "user", "id": MEMBER.user_id}],
    [{"type": "tenant", "id": T1}],
    [{"type": "tenant", "id": T2}],
    [{"type": "user", "id": "d" * 24}],
]
BASE_SECOND = int(time.time()) - 86_400


def _id(second: int, counter: int) -> str:
    return second.to_bytes(4, "big").hex() + counter.to_bytes(8, "big").hex()


flow_case = st.tuples(
    st.integers(0, 2),  # the second (three of them: many ids share one)
    st.integers(0, 2**64 - 1),  # the counter
    st.sampled_from(["shop a", "b SHOP", "shopify", "other", "Shop", "fish"]),
    st.integers(0, len(OWNERS) - 1),
)


async def _check(url: str, registry: Registry, cases: list[tuple[int, int, str, int]], seed: int) -> None:
    db = Database(url)
    made: list[Flow] = []
    try:
        seen: set[str] = set()
        for second, counter, name, owners in cases:
            flow_id = _id(BASE_SECOND + second, counter)
            if flow_id in seen:
                continue
            seen.add(flow_id)
            flow = flows.prepare_new_flow(ADMIN, flow_body(name, owners=OWNERS[owners]), registry)
            flow.id = flow_id
            made.append(flow)
        random.Random(seed).shuffle(made)  # insertion order is not id order
        async with db.write() as session:
            await flows.insert_flows(session, made)
        try:
            # "shop" is served by the trigram index (SQLite: the keyed walk); "sh", shorter than a
            # trigram, by the scan (SQLite: read in id order, unmaterialized, up to the bound).
            for principal, query in itertools.product((ADMIN, MEMBER), ("shop", "sh")):
                keys = set(principal.owner_keys())
                expected = sorted(
                    f.id
                    for f in made
                    if query in f.name.lower()
                    and (principal.is_admin or keys & {(o["type"], o["id"]) for o in f.owners})
                )
                # A member's candidates checked by primary key (ratio 0) and against the set of
                # its flows (a ratio no count reaches), whichever the counts would choose.
                for limit, ratio in ((1, 0), (2, 10**9), (5, 0), (5, 10**9)):
                    with (
                        mock.patch.object(listing, "TOTAL_BOUND", limit),
                        mock.patch.object(flows, "_PROBE_OVER_SET", ratio),
                    ):
                        for size in (1, 2, 3):
                            for number in range(1, len(expected) // size + 3):
                                lq = ListQuery(page=number, size=size, search=query)
                                found, total, exact = await flows.list_flows(db, principal, lq)
                                where = (principal.username, query, limit, size, number)
                                assert [f.id for f in found] == expected[lq.offset : lq.offset + size], where
                                cap = lq.offset + limit
                                assert total == min(len(expected), cap), where
                                assert exact == (len(expected) <= cap), where
        finally:
            async with db.write() as session:
                for flow in made:
                    await flows.delete_flow(session, ADMIN, flow.id)
    finally:
        await db.dispose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(flow_case, min_size=1, max_size=14), seed=st.integers(0, 1000))
def test_bounded_search_pages_equal_the_rule(db_url: str, registry: Registry, cases: Any, seed: int) -> None:
    asyncio.run(_check(db_url, registry, cases, seed))


@pytest.fixture
async def sqlite_db(sqlite_url: str) -> AsyncIterator[Database]:
    db = Database(sqlite_url)
    try:
        yield db
    finally:
        await db.dispose()


async def test_search_keys_follow_the_ids(sqlite_db: Database, registry: Registry) -> None:
    """Migration 0023's triggers: every flow has one key, in its id's second, unique; the FTS
    rowids are exactly the keys; a rename moves a flow's key within its second (search still
    finds it by the new name only); a delete removes both."""
    db = sqlite_db  # the search keys are SQLite's (PostgreSQL searches its trigram indexes)
    made = []
    for i in range(6):
        flow = flows.prepare_new_flow(ADMIN, flow_body(f"keyed-q {i}"), registry)
        flow.id = _id(BASE_SECOND + 10 + i % 2, 1000 - i)
        made.append(flow)
    mine = [f.id for f in made]
    async with db.write() as session:
        await flows.insert_flows(session, made)
        await flows.update_flow(session, ADMIN, made[0].id, {"name": "renamed-q"}, registry)
        await flows.delete_flow(session, ADMIN, made[1].id)
    try:
        async with db.read() as session:
            rows = await session.execute(
                sa.text("SELECT id, key FROM flows_search_keys WHERE id IN :ids").bindparams(
                    sa.bindparam("ids", expanding=True)
                ),
                {"ids": mine},
            )
            keys = dict(rows.all())
            rowids = set(
                (
                    await session.scalars(
                        sa.text("SELECT rowid FROM flows_search WHERE rowid IN :keys").bindparams(
                            sa.bindparam("keys", expanding=True)
                        ),
                        {"keys": list(keys.values())},
                    )
                ).all()
            )
            every = await session.scalar(sa.text("SELECT count(*) FROM flows_search_keys"))
            indexed = await session.scalar(sa.text("SELECT count(*) FROM flows_search"))
            stored = await session.scalar(sa.text("SELECT count(*) FROM flows"))
        assert set(keys) == set(mine) - {made[1].id}
        assert rowids == set(keys.values())
        assert every == indexed == stored  # one key and one indexed row per flow, none left over
        for flow_id, key in keys.items():
            assert key // listing.SEARCH_KEY_SPAN == int(flow_id[:8], 16)
        renamed, _, _ = await flows.list_flows(db, ADMIN, ListQuery(search="renamed-q"))
        assert [f.id for f in renamed] == [made[0].id]
        keyed, total, exact = await flows.list_flows(db, ADMIN, ListQuery(search="keyed-q", size=100))
        assert [f.id for f in keyed] == sorted(mine[2:])
        assert (total, exact) == (4, True)
    finally:
        async with db.write() as session:
            for flow_id in (mine[0], *mine[2:]):
                await flows.delete_flow(session, ADMIN, flow_id)


@pytest.mark.parametrize("searched", [True, False])
async def test_flow_list_meta_says_whether_the_total_is_exact(
    client: httpx.AsyncClient, admin: Account, searched: bool
) -> None:
    """Over HTTP: the flow list's meta carries ``totalExact`` (true for the counted lists, and
    for a search under its bound)."""
    for i in range(3):
        r = await client.post("/flows", json=flow_body(f"meta shop {i}"), headers=admin.headers)
        assert r.status_code == 201, r.text
    query = "?search=meta%20shop&page[size]=2" if searched else "?page[size]=2"
    r = await client.get(f"/flows{query}", headers=admin.headers)
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    assert meta["totalExact"] is True
    assert meta["total"] == 3 if searched else meta["total"] >= 3
    assert meta["totalPages"] == (meta["total"] + 1) // 2
