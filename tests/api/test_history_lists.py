"""Issue 19: the lists over the history (``GET /executions``, ``GET /flows/{id}/executions``,
``GET /logs``) answer a page from an index in the order it is sorted, and ``meta.total`` is an
exact count up to a bound (docs/api.md "Totals of the lists"), on SQLite and
PostgreSQL.

- The plans: every statement such a list sends is explained; none may scan the executions or
  logs table (or the flows' owners) without an index, nor sort (SQLite: no temporary B-tree;
  PostgreSQL: no Seq Scan or Sort even with both made prohibitively expensive, which is how a
  large table would be planned; but for the sort of at most ``offset + size`` ids per arm where
  a member's page merges two index ranges, dialect.newest_of). A correctness guard, not a
  timing.
- The totals: against a count done here by hand, across creates, deletions of flows and
  pruning; and the bound and its flag.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from argon2 import PasswordHasher

from flowyard.api import listing
from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.executions import service as executions_service
from flowyard.iam import passwords
from flowyard.ids import new_id
from flowyard.logs import append as logs
from flowyard.queue import pruner
from flowyard.queue import store as queue
from flowyard.queue.models import Execution
from tests.conftest import Account, Factory, flow_body, force_status


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@dataclass
class Run:
    id: str
    flow: str
    tenant: str | None
    user: str | None
    status: str
    old: bool


@dataclass
class World:
    admin: Account
    alice: Account  # tenant A
    anna: Account  # tenant A
    bob: Account  # tenant B
    loner: Account  # no tenant
    flows: dict[str, tuple[str | None, str]]  # flow id -> (tenant, first user owner)
    runs: list[Run]
    logs: list[dict[str, Any]]


STATUSES = ("queued", "succeeded", "failed", "cancelled")
DAYS_AGO = 30


async def new_flow(client: httpx.AsyncClient, who: Account, **extra: Any) -> str:
    r = await client.post("/flows", json=flow_body(**extra), headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


async def add_runs(db: Database, world: World, flow_id: str, n: int, *, old: bool = False) -> None:
    """``n`` executions of a flow made as the engine makes them (``queue.enqueue``: the row and
    its counters), statuses in turn, each with two log entries (one an error on failures)."""
    tenant, user = world.flows[flow_id]
    now = utcnow() - (timedelta(days=DAYS_AGO) if old else timedelta(0))
    made: list[Run] = []
    async with db.write() as session:
        items = []
        for i in range(n):
            # An id of its creation second (ids.new_id never goes back in time).
            eid = new_id() if not old else int(now.timestamp()).to_bytes(4, "big").hex() + os.urandom(8).hex()
            made.append(Run(eid, flow_id, tenant, user, STATUSES[(len(world.runs) + i) % 4], old))
            items.append(
                queue.NewExecution(
                    id=eid,
                    flow_id=flow_id,
                    flow_version=1,
                    flow_name="f",
                    tenant=tenant,
                    owner_user=user,
                    trigger="manual",
                    input={"i": i},
                    created_at=now,
                )
            )
        await queue.enqueue(session, items)
        for run in made:
            await session.execute(
                sa.text("UPDATE executions SET status = :s WHERE id = :id").bindparams(
                    sa.bindparam("id", type_=Execution.id.type)  # compact on SQLite
                ),
                {"s": run.status, "id": run.id},
            )
        entries = []
        for run in made:
            for step, level in (("in", "info"), ("out", "error" if run.status == "failed" else "info")):
                entry = logs.entry(
                    level,
                    f"{step} ran",
                    tenant=tenant,
                    user_id=user,
                    flow_id=flow_id,
                    execution_id=run.id,
                    step_id=step,
                    component_id="log",
                    timestamp=now,
                )
                entries.append(entry)
        await logs.append(session, entries)
    world.runs += made
    world.logs += entries


async def add_tenant_owner(
    client: httpx.AsyncClient, admin: Account, world: World, flow_id: str, tenant: str | None
) -> None:
    """An administrator adds ``tenant`` to the owners of one of bob's flows (tenant B)."""
    owners = [
        {"id": world.bob.tenant, "type": "tenant"},
        {"id": world.bob.id, "type": "user"},
        {"id": tenant, "type": "tenant"},
    ]
    r = await client.patch(f"/flows/{flow_id}", json={"owners": owners}, headers=admin.headers)
    assert r.status_code == 200, r.text


async def make_world(client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account) -> World:
    tenant_a, tenant_b = await factory.tenant(), await factory.tenant()
    alice, anna = await factory.user(tenant=tenant_a), await factory.user(tenant=tenant_a)
    bob, loner = await factory.user(tenant=tenant_b), await factory.user()
    world = World(admin, alice, anna, bob, loner, {}, [], [])
    for who, count in ((alice, 2), (bob, 1), (loner, 1)):
        for _ in range(count):
            world.flows[await new_flow(client, who)] = (who.tenant, who.id)
    # A tenantless flow whose only owner is alice (an administrator made it): alice sees its
    # executions, anna (same tenant) does not.
    private = await new_flow(client, admin, owners=[{"id": alice.id, "type": "user"}])
    world.flows[private] = (None, alice.id)
    for i, fid in enumerate(world.flows):
        await add_runs(db, world, fid, 3 + i)
        await add_runs(db, world, fid, 2, old=True)
    return world


def sees(world: World, who: Account, run: Run) -> bool:
    """SPEC §2 for executions, by hand: admins all; others the runs of flows they see (the
    flows they made are owned by them and their tenant; ``private`` by alice alone)."""
    if who.id == world.admin.id:
        return True
    if run.flow not in world.flows:  # deleted: gone with its owners
        return False
    tenant, user = world.flows[run.flow]
    return user == who.id or (who.tenant is not None and tenant == who.tenant)


def reads_log(world: World, who: Account, entry: dict[str, Any], named: str) -> bool:
    """``GET /logs?filter[tenant]=named`` by hand (logs/service.py ``named_scope``)."""
    if named.startswith("user:"):
        return entry["tenant"] is None and entry["user_id"] == named[5:]
    return bool(entry["tenant"] == named)


async def meta(client: httpx.AsyncClient, path: str, who: Account, **params: Any) -> dict[str, Any]:
    r = await client.get(path, params=params, headers=who.headers)
    assert r.status_code == 200, r.text
    body = r.json()
    return {**body["meta"], "ids": [e["id"] for e in body["data"]]}


async def check_totals(client: httpx.AsyncClient, world: World) -> None:
    everyone = (world.admin, world.alice, world.anna, world.bob, world.loner)
    for who in everyone:
        mine = [r for r in world.runs if sees(world, who, r)]
        newest = sorted((r.id for r in mine), reverse=True)
        got = await meta(client, "/executions", who, **{"page[size]": 1000})
        assert (got["total"], got["totalExact"], got["ids"]) == (len(mine), True, newest), who.username
        for status in STATUSES:
            want = [r for r in mine if r.status == status]
            got = await meta(client, "/executions", who, **{"filter[status]": status})
            assert got["total"] == len(want), (who.username, status)
        for fid in {r.flow for r in world.runs}:
            want = [r for r in mine if r.flow == fid]
            got = await meta(client, "/executions", who, **{"filter[flowId]": fid})
            assert got["total"] == len(want), (who.username, fid)
            want = [r for r in want if r.status == "failed"]
            got = await meta(
                client, "/executions", who, **{"filter[flowId]": fid, "filter[status]": "failed"}
            )
            assert got["total"] == len(want), (who.username, fid)
            if fid in world.flows and want:
                got = await meta(client, f"/flows/{fid}/executions", who, **{"filter[status]": "failed"})
                assert got["total"] == len(want)
    tenant_a = world.alice.tenant
    assert tenant_a is not None
    for who, named in ((world.alice, tenant_a), (world.admin, tenant_a), (world.loner, world.loner.id)):
        key = named if named != world.loner.id else f"user:{named}"
        mine = [e for e in world.logs if reads_log(world, who, e, key)]
        got = await meta(client, "/logs", who, **{"filter[tenant]": named})
        assert (got["total"], got["totalExact"]) == (len(mine), True), who.username
        errors = [e for e in mine if e["level"] == "error"]
        got = await meta(client, "/logs", who, **{"filter[tenant]": named, "showErrors": "true"})
        assert got["total"] == len(errors)
        for fid in {e["flow_id"] for e in mine}:
            want = [e for e in mine if e["flow_id"] == fid and e["step_id"] == "out"]
            got = await meta(
                client,
                "/logs",
                who,
                **{"filter[tenant]": named, "filter[flowId]": fid, "filter[stepId]": "out"},
            )
            assert got["total"] == len(want)


async def test_totals_are_exact_across_creates_deletions_and_pruning(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    world = await make_world(client, db, factory, admin)
    await check_totals(client, world)
    # A deleted flow's executions leave the lists (administrators keep them); its logs stay.
    gone = next(fid for fid, (tenant, user) in world.flows.items() if user == world.alice.id and tenant)
    await force_status(db, gone, "inactive")
    assert (await client.delete(f"/flows/{gone}", headers=world.alice.headers)).status_code == 200
    del world.flows[gone]
    await check_totals(client, world)
    # More runs, then pruning: old finished executions and old logs go.
    for fid in list(world.flows)[:2]:
        await add_runs(db, world, fid, 2)
    pruned = await pruner.prune(db, retention=timedelta(days=DAYS_AGO - 1), batch=4)
    old_finished = [r for r in world.runs if r.old and r.status != "queued"]
    assert pruned["executions"] == len(old_finished)
    world.runs = [r for r in world.runs if r not in old_finished]
    old_ids = {r.id for r in world.runs if r.old} | {r.id for r in old_finished}
    world.logs = [e for e in world.logs if e["execution_id"] not in old_ids]
    assert pruned["logs"] > 0
    await check_totals(client, world)


async def db_set(db: Database, sql: str, **params: Any) -> None:
    async with db.write() as session:
        await session.execute(sa.text(sql), params)


async def test_total_is_bounded_and_says_so(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = await make_world(client, db, factory, admin)
    monkeypatch.setattr(listing, "TOTAL_BOUND", 3)
    every = sorted((r.id for r in world.runs), reverse=True)
    assert len(every) > 8
    # Counted up to 3 past the page's start: page 1 of 2 says "at least 3".
    got = await meta(client, "/executions", admin, **{"page[size]": 2})
    assert (got["total"], got["totalExact"], got["totalPages"], got["ids"]) == (3, False, 2, every[:2])
    # Deep enough, the count reaches the end and is exact again.
    last = (len(every) - 1) // 2 + 1
    got = await meta(client, "/executions", admin, **{"page[size]": 2, "page[number]": last})
    assert (got["total"], got["totalExact"], got["ids"]) == (len(every), True, every[(last - 1) * 2 :])
    # A member's two parts (its tenant's, and its own elsewhere) are counted together.
    mine = sorted((r.id for r in world.runs if sees(world, world.alice, r)), reverse=True)
    got = await meta(client, "/executions", world.alice, **{"page[size]": 4, "page[number]": 2})
    assert (got["total"], got["totalExact"], got["ids"]) == (min(len(mine), 7), len(mine) <= 7, mine[4:8])
    tenant_a = world.alice.tenant
    got = await meta(client, "/logs", world.alice, **{"filter[tenant]": tenant_a})
    assert (got["total"], got["totalExact"]) == (3, False)
    # Past the end of what is counted, a page still answers (empty) with the bound it reached.
    got = await meta(client, "/executions", world.bob, **{"page[number]": 50})
    assert got["ids"] == [] and got["totalExact"] is True


# -- plans --------------------------------------------------------------------------------

_TABLES = r"(executions|logs|flow_owners|flows)"


@contextmanager
def statements(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """The statements sent while in the block that read executions or logs."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and re.search(
            r"FROM (executions|logs)\b", statement
        ):
            seen.append((statement, parameters))

    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(db.engine.sync_engine, "before_cursor_execute", record)


async def plan_problems(db: Database, statement: str, parameters: Any) -> list[str]:
    async with db.engine.connect() as conn:
        if db.is_sqlite:
            rows = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)).all()
            lines = [str(r[-1]) for r in rows]
            return [
                line
                for line in lines
                if "TEMP B-TREE" in line or re.search(rf"\bSCAN {_TABLES}\b(?! USING)", line)
            ]
        # A small table is read whole and sorted: make both prohibitively expensive, as a
        # large table makes them, and see whether an index still answers in order.
        for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
            await conn.exec_driver_sql(f"SET LOCAL {setting} = off")
        raw = (await conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)).scalar()
        plan = json.loads(raw) if isinstance(raw, str) else raw
        found: list[str] = []

        def bounded(node: dict[str, Any]) -> bool:
            """A sort of a few rows: of arms that each stop at a LIMIT (dialect.newest_of)."""
            below = node.get("Plans", [])
            while len(below) == 1 and below[0].get("Node Type") in ("Append", "Subquery Scan"):
                below = below[0].get("Plans", [])
            return len(below) > 1 and all(
                child.get("Node Type") == "Limit"
                or (
                    child.get("Node Type") == "Subquery Scan"
                    and child["Plans"][0].get("Node Type") == "Limit"
                )
                for child in below
            )

        def walk(node: dict[str, Any]) -> None:
            kind = node.get("Node Type", "")
            if (kind in ("Sort", "Incremental Sort") and not bounded(node)) or (
                kind == "Seq Scan" and re.fullmatch(_TABLES, node.get("Relation Name", ""))
            ):
                found.append(f"{kind} {node.get('Relation Name', '')}".strip())
            for child in node.get("Plans", []):
                walk(child)

        walk(plan[0]["Plan"])
        return found


async def test_every_listing_reads_an_index_in_order(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    world = await make_world(client, db, factory, admin)
    fid = next(iter(world.flows))
    eid = world.runs[0].id
    tenant_a = world.alice.tenant
    lists: list[tuple[Account, str, dict[str, Any]]] = []
    # alice's executions come from two index ranges (her tenant's, and her tenantless flow's),
    # anna's from one.
    for who in (world.admin, world.alice, world.anna, world.loner):
        for filters in (
            {},
            {"filter[status]": "failed"},
            {"filter[flowId]": fid},
            {"filter[flowId]": fid, "filter[status]": "failed"},
        ):
            lists.append((who, "/executions", filters))
        if who is not world.loner:
            lists.append((who, f"/flows/{fid}/executions", {}))
            lists.append((who, f"/flows/{fid}/executions", {"filter[status]": "queued"}))
    for who, named in (
        (world.admin, tenant_a),
        (world.alice, tenant_a),
        (world.loner, world.loner.id),
        (world.admin, world.loner.id),
    ):
        for filters in (
            {},
            {"filter[flowId]": fid},
            {"filter[executionId]": eid},
            {"filter[stepId]": "out"},
            {"showErrors": "true"},
            {"filter[flowId]": fid, "showErrors": "true"},
            {"from": "2020-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"},
        ):
            lists.append((who, "/logs", {"filter[tenant]": named, **filters}))
    problems = []
    for who, path, filters in lists:
        for number in (1, 500):
            params = {**filters, "page[size]": 10, "page[number]": number}
            # Page 500 is past this small world's end: its count is checked; its page query
            # has page 1's plan (the offset is a bound parameter).
            with statements(db) as seen:
                r = await client.get(path, params=params, headers=who.headers)
            assert r.status_code == 200, (path, r.text)
            # The loner does not see alice's flow: decided from its owners, no history read.
            unseen = who is world.loner and path == "/executions" and "filter[flowId]" in filters
            assert bool(seen) != unseen, (path, filters)
            assert not unseen or r.json()["meta"]["total"] == 0
            for statement, parameters in seen:
                bad = await plan_problems(db, statement, parameters)
                if bad:
                    problems.append((who.username, path, filters, number, bad, statement))
    assert not problems, "\n".join(map(str, problems))


async def test_every_page_query_is_checked(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """The plan test sees the page queries too, not only the counts: a page within the
    total sends both."""
    world = await make_world(client, db, factory, admin)
    with statements(db) as seen:
        r = await client.get("/executions", headers=world.alice.headers)
    assert r.status_code == 200 and r.json()["data"]
    assert len(seen) >= 2 and any("ORDER BY" in s for s, _p in seen)


async def test_a_members_page_reads_added_owner_flows_by_flow_not_by_status(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """Alice's tenant was added as an owner of one of bob's flows (tenant B): her pages merge
    her tenant's range with that flow's. Each range is read in id order from its own index; the
    added flow's executions are never found by scanning every tenant's executions of a status
    (``ix_executions_status_id``), which grows with the whole history."""
    world = await make_world(client, db, factory, admin)
    tenant_a, tenant_b = world.alice.tenant, world.bob.tenant
    shared = next(fid for fid, (tenant, _user) in world.flows.items() if tenant == tenant_b)
    await add_tenant_owner(client, admin, world, shared, tenant_a)
    await add_runs(db, world, shared, 8)

    def hers(run: Run) -> bool:
        return sees(world, world.alice, run) or run.flow == shared

    for status in (None, "failed"):
        want = sorted((r.id for r in world.runs if hers(r) and status in (None, r.status)), reverse=True)
        assert any(world.flows.get(r.flow, (None,))[0] == tenant_b for r in world.runs if r.id in want)
        params: dict[str, Any] = {"page[size]": 3} | ({"filter[status]": status} if status else {})
        got: list[str] = []
        for number in range(1, len(want) // 3 + 2):
            with statements(db) as seen:
                page = await meta(client, "/executions", world.alice, **params, **{"page[number]": number})
            assert page["total"] == len(want) and page["totalExact"] is True
            got += page["ids"]
            for statement, parameters in seen:
                plan = await plan_text(db, statement, parameters)
                assert "ix_executions_status_id" not in plan, (status, number, plan)
                assert not await plan_problems(db, statement, parameters), (status, number, statement)
        assert got == want, status


async def test_an_added_flow_without_a_user_owner_is_listed_whole(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """An administrator's flow whose owners are tenants only (B, then alice's A): its
    executions are charged to no user (``owner_user`` NULL) and, the flow being the
    administrator's, to no tenant. Alice sees them all, listed
    and filtered (they are recorded on neither her tenant nor her, a NULL-safe test), and so does
    bob (tenant B); the loner none."""
    world = await make_world(client, db, factory, admin)
    tenant_a, tenant_b = world.alice.tenant, world.bob.tenant
    owners = [{"id": tenant_b, "type": "tenant"}, {"id": tenant_a, "type": "tenant"}]
    shared = await new_flow(client, admin, owners=owners)
    r = await client.get(f"/flows/{shared}", headers=admin.headers)
    world.flows[shared] = (r.json()["data"]["tenant"], None)
    await add_runs(db, world, shared, 6)
    theirs = {r.id for r in world.runs if r.flow == shared}
    assert len(theirs) == 6
    for who, sees_them in ((world.alice, True), (world.anna, True), (world.bob, True), (world.loner, False)):
        want = sorted(
            (r.id for r in world.runs if sees(world, who, r) or (sees_them and r.flow == shared)),
            reverse=True,
        )
        got = await meta(client, "/executions", who, **{"page[size]": 1000})
        assert (got["total"], got["ids"]) == (len(want), want), who.username
        assert (theirs <= set(got["ids"])) is sees_them, who.username
        got = await meta(client, "/executions", who, **{"filter[flowId]": shared, "page[size]": 1000})
        assert set(got["ids"]) == (theirs if sees_them else set()), who.username
        failed = sorted(
            (r for r in want if next(x.status for x in world.runs if x.id == r) == "failed"), reverse=True
        )
        got = await meta(client, "/executions", who, **{"filter[status]": "failed", "page[size]": 1000})
        assert got["ids"] == failed, who.username
        assert bool(theirs & set(got["ids"])) is (
            sees_them and any(r.status == "failed" for r in world.runs if r.id in theirs)
        )


async def test_a_members_own_executions_elsewhere_are_read_by_tenant_not_by_walking_its_own(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """Alice owns flows of her tenant (many executions), one of no tenant (``private``) and one
    of tenant B that an administrator made for her: her pages read each of the few outside her
    tenant from that tenant's range of her own executions (an index range in id order, found by
    a loose scan), never from all her own executions with the tenant as a filter, which grows
    with her whole history. Each page is the hand-made answer."""
    world = await make_world(client, db, factory, admin)
    tenant_b = world.bob.tenant
    owners = [{"id": tenant_b, "type": "tenant"}, {"id": world.alice.id, "type": "user"}]
    elsewhere = await new_flow(client, admin, owners=owners)
    world.flows[elsewhere] = (tenant_b, world.alice.id)
    await add_runs(db, world, elsewhere, 5)
    mine = [fid for fid, (tenant, user) in world.flows.items() if user == world.alice.id]
    assert {world.flows[fid][0] for fid in mine} == {world.alice.tenant, None, tenant_b}
    for who in (world.alice, world.loner, world.bob):
        for status in (None, "failed"):
            want = sorted(
                (r.id for r in world.runs if sees(world, who, r) and status in (None, r.status)), reverse=True
            )
            params: dict[str, Any] = {"page[size]": 4} | ({"filter[status]": status} if status else {})
            got: list[str] = []
            for number in range(1, len(want) // 4 + 2):
                with statements(db) as seen:
                    page = await meta(client, "/executions", who, **params, **{"page[number]": number})
                assert page["total"] == len(want) and page["totalExact"] is True, (who.username, status)
                got += page["ids"]
                for statement, parameters in seen:
                    plan = await plan_text(db, statement, parameters)
                    if db.is_sqlite:
                        walked = re.findall(r"INDEX (ix_executions_owner_\w+) \(owner_user=\?\)", plan)
                    else:
                        alone = r"using (ix_executions_owner_\w+) on .*\n\s*Index Cond: "
                        alone += r"\(\(owner_user\)::text = '\w+'::text\)\n"
                        walked = re.findall(alone, plan + "\n")
                    assert not walked, (who.username, status, number, plan)
                    assert not await plan_problems(db, statement, parameters), (who.username, statement)
            assert got == want, (who.username, status)


async def test_own_executions_of_an_empty_tenant_are_listed(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """An administrator may give a flow the tenant ``""`` (flows/validation.py accepts it):
    its executions are recorded on that tenant and charged to its user owner, who lists them
    like any other of its own executions outside its tenant (the loose scan of the owner's
    tenants starts below every value, the empty one included)."""
    world = await make_world(client, db, factory, admin)
    for who in (world.alice, world.loner):
        r = await client.post(
            "/flows",
            json=flow_body(tenant="", owners=[{"id": who.id, "type": "user"}]),
            headers=admin.headers,
        )
        assert r.status_code == 201, r.text
        assert r.json()["data"]["tenant"] == ""
        fid = str(r.json()["data"]["id"])
        world.flows[fid] = ("", who.id)
        await add_runs(db, world, fid, 3)
    for who in (world.alice, world.anna, world.loner, world.bob):
        for status in (None, "failed", "queued"):
            want = sorted(
                (r.id for r in world.runs if sees(world, who, r) and status in (None, r.status)), reverse=True
            )
            params: dict[str, Any] = {"page[size]": 1000} | ({"filter[status]": status} if status else {})
            got = await meta(client, "/executions", who, **params)
            assert (got["total"], got["ids"]) == (len(want), want), (who.username, status)


@pytest.mark.parametrize("caps", [(0, 0), (1, 1)], ids=["no-arms", "one-arm"])
async def test_past_the_arm_caps_a_page_is_still_the_rule(
    client: httpx.AsyncClient,
    db: Database,
    factory: Factory,
    admin: Account,
    monkeypatch: pytest.MonkeyPatch,
    caps: tuple[int, int],
) -> None:
    """Past ``_ADDED_FLOW_ARMS`` added-owner flows, or ``_OWN_TENANT_ARMS`` tenants of the
    caller's own executions elsewhere, a page falls back to one part over all of them (which
    a page sorts): the answer is the same. Alice has two tenants elsewhere (none, and B) and an
    added-owner flow; the caps are made 0 and 1 so that the fallbacks are taken."""
    monkeypatch.setattr(executions_service, "_ADDED_FLOW_ARMS", caps[0])
    monkeypatch.setattr(executions_service, "_OWN_TENANT_ARMS", caps[1])
    world = await make_world(client, db, factory, admin)
    tenant_a, tenant_b = world.alice.tenant, world.bob.tenant
    elsewhere = await new_flow(
        client, admin, owners=[{"id": tenant_b, "type": "tenant"}, {"id": world.alice.id, "type": "user"}]
    )
    world.flows[elsewhere] = (tenant_b, world.alice.id)
    await add_runs(db, world, elsewhere, 4)
    shared = next(
        fid for fid, (tenant, user) in world.flows.items() if tenant == tenant_b and user == world.bob.id
    )
    await add_tenant_owner(client, admin, world, shared, tenant_a)
    for who in (world.alice, world.anna, world.loner):
        for status in (None, "failed"):
            want = sorted(
                (
                    r.id
                    for r in world.runs
                    if (sees(world, who, r) or (r.flow == shared and who.tenant == tenant_a))
                    and status in (None, r.status)
                ),
                reverse=True,
            )
            params: dict[str, Any] = {"page[size]": 5} | ({"filter[status]": status} if status else {})
            got: list[str] = []
            for number in range(1, len(want) // 5 + 2):
                with statements(db) as seen:
                    page = await meta(client, "/executions", who, **params, **{"page[number]": number})
                assert (page["total"], page["totalExact"]) == (len(want), True), (who.username, status)
                got += page["ids"]
                # The fallback parts still read an index range each (their order sorted by the
                # page), never the whole table: the owner's indexes are partial.
                for statement, parameters in seen:
                    assert not await walks_executions(db, statement, parameters), (who.username, statement)
            assert got == want, (who.username, status)


async def walks_executions(db: Database, statement: str, parameters: Any) -> list[str]:
    """The scans of ``executions`` in the plan that no index condition bounds (SQLite: ``SCAN``,
    with or without an index; PostgreSQL: a scan whose next line is not its ``Index Cond``)."""
    if not db.is_sqlite and "ORDER BY" in statement:
        # plan_text makes sorting prohibitively expensive, so on this small table a fallback
        # page (whose order is sorted by design) is planned as a walk of the primary key:
        # PostgreSQL's counts are checked, SQLite's pages and counts.
        return []
    plan = await plan_text(db, statement, parameters)
    if db.is_sqlite:
        return re.findall(r"SCAN executions\b.*", plan)
    lines = plan.splitlines()
    return [
        line
        for i, line in enumerate(lines)
        if re.search(r"Scan.* on executions\b", line)
        and not (i + 1 < len(lines) and "Index Cond" in lines[i + 1])
    ]


async def plan_text(db: Database, statement: str, parameters: Any) -> str:
    async with db.engine.connect() as conn:
        if db.is_sqlite:
            rows = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)).all()
            return "\n".join(str(r[-1]) for r in rows)
        for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
            await conn.exec_driver_sql(f"SET LOCAL {setting} = off")
        rows = (await conn.exec_driver_sql("EXPLAIN " + statement, parameters)).all()
        return "\n".join(str(r[0]) for r in rows)
