"""Who reads executions, counts and logs (issue 7, items 4 and 5), written as the attacks,
on SQLite and PostgreSQL. Executions are made by the manual-run endpoint of flows set active
directly (no engine runs here, so they stay queued); the logs test runs the real engine."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from argon2 import PasswordHasher

from flowyard.db.session import Database
from flowyard.iam import passwords
from tests.conftest import Account, Factory, flow_body, force_status, wait_until

UNRELATED = "iam.token.delete"


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


async def set_flow(db: Database, flow_id: str, **values: str) -> None:
    """Write flow columns directly (no engine runs to move a flow to active here)."""
    if "status" in values:  # the list counts move with the status
        await force_status(db, flow_id, values.pop("status"), **values)
        return
    sets = ", ".join(f"{k} = :{k}" for k in values)
    async with db.write() as session:
        await session.execute(sa.text(f"UPDATE flows SET {sets} WHERE id = :id"), {**values, "id": flow_id})


async def set_active(db: Database, flow_id: str) -> None:
    await set_flow(db, flow_id, status="active")


async def new_flow(client: httpx.AsyncClient, who: Account, **extra: Any) -> str:
    r = await client.post("/flows", json=flow_body(**extra), headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


async def run(client: httpx.AsyncClient, db: Database, who: Account, flow_id: str) -> str:
    await set_active(db, flow_id)
    r = await client.post(f"/flows/{flow_id}/executions", json={"n": 1}, headers=who.headers)
    assert r.status_code == 202, r.text
    return str(r.json()["data"]["executionId"])


async def narrowed(client: httpx.AsyncClient, who: Account, *permissions: str) -> dict[str, str]:
    r = await client.post("/tokens", json={"permissions": list(permissions)}, headers=who.headers)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['data']['token']}"}


async def listed(client: httpx.AsyncClient, headers: dict[str, str], **params: str) -> list[str]:
    r = await client.get("/executions", params=params, headers=headers)
    assert r.status_code == 200, r.text
    return [e["id"] for e in r.json()["data"]]


async def test_narrowed_tokens_cannot_read_or_run_executions(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)  # member defaults include iam.token.delete
    fid = await new_flow(client, member)
    eid = await run(client, db, member, fid)
    # The legitimate path: the member's full token.
    assert await listed(client, member.headers) == [eid]
    assert (await client.get(f"/executions/{eid}", headers=member.headers)).status_code == 200
    for headers in (await narrowed(client, member, UNRELATED), await narrowed(client, admin, UNRELATED)):
        for path in ("/executions", f"/executions/{eid}", f"/flows/{fid}/executions"):
            r = await client.get(path, headers=headers)
            assert r.status_code == 403, (path, r.text)
            assert "tenant.flows.read" in r.json()["errors"][0]["message"]
        r = await client.post(f"/flows/{fid}/executions", json={}, headers=headers)
        assert r.status_code == 403, r.text
    # Narrowed to read, a token reads but does not run.
    reader = await narrowed(client, member, "tenant.flows.read")
    assert await listed(client, reader) == [eid]
    assert (await client.post(f"/flows/{fid}/executions", json={}, headers=reader)).status_code == 403
    assert await listed(client, member.headers) == [eid]  # nothing was queued by the refusals


async def test_member_of_another_tenant_sees_no_execution(
    client: httpx.AsyncClient, db: Database, factory: Factory
) -> None:
    tenant_a, tenant_b = await factory.tenant(), await factory.tenant()
    alice = await factory.user(tenant=tenant_a)
    bob = await factory.user(tenant=tenant_b)
    fid = await new_flow(client, alice)
    eid = await run(client, db, alice, fid)
    assert (await client.get(f"/executions/{eid}", headers=bob.headers)).status_code == 404
    assert (await client.get(f"/flows/{fid}/executions", headers=bob.headers)).status_code == 404
    assert await listed(client, bob.headers) == []
    assert await listed(client, bob.headers, **{"filter[flowId]": fid}) == []
    assert (await client.post(f"/flows/{fid}/executions", json={}, headers=bob.headers)).status_code == 404
    # Bob's own executions are his alone.
    own = await run(client, db, bob, await new_flow(client, bob))
    assert await listed(client, bob.headers) == [own]
    assert await listed(client, alice.headers) == [eid]


async def test_executions_follow_flow_visibility_not_the_tenant_column(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """The reverse bug: a member who is only a user owner of a flow (the flow has no tenant)
    sees its executions; another member of the same tenant, who does not see the flow, does not."""
    tenant = await factory.tenant()
    alice = await factory.user(tenant=tenant)
    anna = await factory.user(tenant=tenant)
    fid = await new_flow(client, admin, owners=[{"id": alice.id, "type": "user"}])
    flow = (await client.get(f"/flows/{fid}", headers=alice.headers)).json()["data"]
    assert flow["tenant"] is None and {"id": tenant, "type": "tenant"} not in flow["owners"]
    eid = await run(client, db, admin, fid)
    assert await listed(client, alice.headers) == [eid]
    assert await listed(client, alice.headers, **{"filter[flowId]": fid}) == [eid]
    r = await client.get(f"/executions/{eid}", headers=alice.headers)
    assert r.status_code == 200 and r.json()["data"]["flowId"] == fid
    r = await client.get(f"/flows/{fid}/executions", headers=alice.headers)
    assert [e["id"] for e in r.json()["data"]] == [eid] and r.json()["meta"]["total"] == 1
    # Anna is in the same tenant but does not see the flow, hence not its executions.
    assert (await client.get(f"/flows/{fid}", headers=anna.headers)).status_code == 404
    assert (await client.get(f"/executions/{eid}", headers=anna.headers)).status_code == 404
    assert await listed(client, anna.headers) == []
    # And the tenant column alone no longer shows a flow's runs: a tenant-A flow whose
    # owners the administrator narrowed to one user is invisible to the other members.
    private = await new_flow(client, admin, owners=[{"id": alice.id, "type": "user"}])
    await set_flow(db, private, tenant=tenant)
    hidden = await run(client, db, admin, private)
    assert (await client.get(f"/executions/{hidden}", headers=anna.headers)).status_code == 404
    assert (await client.get(f"/executions/{hidden}", headers=alice.headers)).status_code == 200


async def test_executions_of_a_deleted_flow(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """A deleted flow's executions leave everyone's lists but the administrators' (issue 19:
    they go with the flow's owners, no per-row search for deleted flows); its counts and logs
    stay. Nobody else gains anything."""
    tenant_a, tenant_b = await factory.tenant(), await factory.tenant()
    alice = await factory.user(tenant=tenant_a)
    anna = await factory.user(tenant=tenant_a)
    bob = await factory.user(tenant=tenant_b)
    loner = await factory.user()  # no tenant
    stranger = await factory.user()  # no tenant either
    fid = await new_flow(client, alice)
    eid = await run(client, db, alice, fid)
    lone_fid = await new_flow(client, loner)
    lone_eid = await run(client, db, loner, lone_fid)
    live = await run(client, db, alice, await new_flow(client, alice))
    for flow_id, who in ((fid, alice), (lone_fid, loner)):
        await set_flow(db, flow_id, status="inactive")
        assert (await client.delete(f"/flows/{flow_id}", headers=who.headers)).status_code == 200
    for who, sees in ((alice, [live]), (anna, [live]), (loner, []), (admin, [live, lone_eid, eid])):
        assert sorted(await listed(client, who.headers)) == sorted(sees), who
        r = await client.get("/executions", headers=who.headers)
        assert r.json()["meta"]["total"] == len(sees) and r.json()["meta"]["totalExact"] is True
    for who in (alice, anna, loner, bob, stranger):
        assert await listed(client, who.headers, **{"filter[flowId]": fid}) == []
        for e in (eid, lone_eid):
            assert (await client.get(f"/executions/{e}", headers=who.headers)).status_code == 404
    for who in (bob, stranger):
        assert await listed(client, who.headers) == []
    # Administrators keep the history: listed, filtered by the gone flow, read by id.
    assert await listed(client, admin.headers, **{"filter[flowId]": fid}) == [eid]
    assert (await client.get(f"/executions/{eid}", headers=admin.headers)).status_code == 200
    # The flow itself is gone: its sub-resource answers 404.
    assert (await client.get(f"/flows/{fid}/executions", headers=alice.headers)).status_code == 404


async def test_reading_executions_needs_flows_read(
    client: httpx.AsyncClient, db: Database, factory: Factory
) -> None:
    tenant = await factory.tenant()
    alice = await factory.user(tenant=tenant)
    runner = await factory.user(tenant=tenant, permissions=["tenant.flows.update"])
    blind = await factory.user(tenant=tenant, permissions=["iam.token.create"])
    fid = await new_flow(client, alice)
    eid = await run(client, db, alice, fid)
    for path in ("/executions", f"/executions/{eid}", f"/flows/{fid}/executions"):
        assert (await client.get(path, headers=blind.headers)).status_code == 403
        assert (await client.get(path, headers=runner.headers)).status_code == 403
    # Running needs tenant.flows.update: a reader cannot, the runner can (it sees the flow).
    reader = await factory.user(tenant=tenant, permissions=["tenant.flows.read"])
    assert (await client.post(f"/flows/{fid}/executions", json={}, headers=reader.headers)).status_code == 403
    assert (await client.post(f"/flows/{fid}/executions", json={}, headers=runner.headers)).status_code == 202


async def test_counts_any_caller_own_tenant_only(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """SPEC §8/§2: counts need no permission, show the caller's tenant (without a tenant, the
    flows it owns); admins see all. A narrowed token therefore still reads its tenant's counts,
    and the administrator's narrowed token is no longer an administrator's."""
    tenant_a, tenant_b = await factory.tenant(), await factory.tenant()
    alice = await factory.user(tenant=tenant_a)
    bob = await factory.user(tenant=tenant_b)
    loner = await factory.user()
    fa = await new_flow(client, alice)
    await run(client, db, alice, fa)
    await run(client, db, alice, fa)
    fb = await new_flow(client, bob)
    await run(client, db, bob, fb)
    fl = await new_flow(client, loner)
    await run(client, db, loner, fl)
    fadmin = await new_flow(client, admin)
    await run(client, db, admin, fadmin)

    async def counts(headers: dict[str, str]) -> dict[str, int]:
        r = await client.get("/icenter/executions", params={"groupby": "flow"}, headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["metadata"]["totalExecutions"] == sum(x["executions"] for x in body["data"])
        return {x["flow"]: x["executions"] for x in body["data"]}

    assert await counts(alice.headers) == {fa: 2}
    assert await counts(await narrowed(client, alice, UNRELATED)) == {fa: 2}
    assert await counts(bob.headers) == {fb: 1}
    assert await counts(loner.headers) == {fl: 1}
    assert await counts(admin.headers) == {fa: 2, fb: 1, fl: 1, fadmin: 1}
    assert await counts(await narrowed(client, admin, UNRELATED)) == {fadmin: 1}
    nobody = await factory.user(tenant=tenant_a, permissions=[])
    assert await counts(nobody.headers) == {fa: 2}
    assert (await client.get("/icenter/executions")).status_code == 401


async def test_logs_rules_for_every_kind_of_caller(
    engine_client: httpx.AsyncClient, factory: Factory, admin: Account
) -> None:
    """The first administrator (no tenant, as on the embedded default) reads its own flows'
    logs by naming its user id, as docs/api.md says; naming a tenant still gives that tenant's
    logs; nobody else may name the administrator or another tenant."""
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    loner = await factory.user()
    flows: dict[str, str] = {}
    for who in (admin, member, loner):
        fid = await new_flow(c, who)
        assert (await c.post(f"/flows/{fid}/start", headers=who.headers)).status_code == 200

        async def active(fid: str = fid, who: Account = who) -> bool:
            r = await c.get(f"/flows/{fid}", headers=who.headers)
            return bool(r.json()["data"]["status"] == "active")

        await wait_until(active)
        r = await c.post(f"/webhooks/{fid}", json={"who": who.username})
        assert r.status_code == 202, r.text
        flows[who.id] = fid

    async def logs(headers: dict[str, str], named: str, **extra: str) -> tuple[int, set[str]]:
        r = await c.get("/logs", params={"filter[tenant]": named, **extra}, headers=headers)
        return r.status_code, {e["flowId"] for e in r.json().get("data", [])}

    async def logged() -> bool:
        found = [(await logs(admin.headers, named))[1] for named in (admin.id, tenant, loner.id)]
        return all(found)

    await wait_until(logged)
    assert await logs(admin.headers, admin.id) == (200, {flows[admin.id]})
    own = {"filter[flowId]": flows[admin.id]}
    assert await logs(admin.headers, admin.id, **own) == (200, {flows[admin.id]})
    assert await logs(admin.headers, tenant) == (200, {flows[member.id]})
    assert await logs(admin.headers, loner.id) == (200, {flows[loner.id]})
    assert await logs(member.headers, tenant) == (200, {flows[member.id]})
    assert await logs(loner.headers, loner.id) == (200, {flows[loner.id]})
    for who, named in ((member, admin.id), (loner, admin.id), (loner, tenant), (member, loner.id)):
        assert (await logs(who.headers, named))[0] == 403
    # The administrator's narrowed token is a caller without a tenant: its own flows only.
    slim = await narrowed(c, admin, UNRELATED)
    assert await logs(slim, admin.id) == (200, {flows[admin.id]})
    assert (await logs(slim, tenant))[0] == 403


async def test_recorded_scope_never_widens_visibility(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """Lists read the tenant and user owner recorded on an execution (issue 19), always checked
    against the flow's owners now: a flow moved to another tenant, or a user owner removed,
    takes the old executions out of the old owners' lists and reads, though their recorded
    columns still name them."""
    tenant_a, tenant_b = await factory.tenant(), await factory.tenant()
    alice = await factory.user(tenant=tenant_a)
    bob = await factory.user(tenant=tenant_b)
    loner = await factory.user()
    moved = await new_flow(client, alice)
    eid = await run(client, db, alice, moved)
    lone = await new_flow(client, loner)
    lone_eid = await run(client, db, loner, lone)
    # The administrator moves the flow to tenant B and gives the tenantless flow to itself.
    for fid, body in (
        (moved, {"tenant": tenant_b, "owners": [{"id": bob.id, "type": "user"}]}),
        (lone, {"owners": [{"id": admin.id, "type": "user"}]}),
    ):
        await set_flow(db, fid, status="inactive")
        r = await client.patch(f"/flows/{fid}", json=body, headers=admin.headers)
        assert r.status_code == 200, r.text
        assert {"id": alice.id, "type": "user"} not in r.json()["data"]["owners"]
    for who, gone, fid in ((alice, eid, moved), (loner, lone_eid, lone)):
        assert (await client.get(f"/flows/{fid}", headers=who.headers)).status_code == 404
        assert await listed(client, who.headers) == []
        for params in ({"filter[flowId]": fid}, {"filter[status]": "queued"}):
            assert await listed(client, who.headers, **params) == []
        assert (await client.get(f"/executions/{gone}", headers=who.headers)).status_code == 404
        r = await client.get("/executions", headers=who.headers)
        assert r.json()["meta"]["total"] == 0
    # Bob sees the flow now, and its new runs; the runs recorded on tenant A stay out of his
    # lists (docs/api.md: lists read the recorded tenant), and administrators see all.
    new = await run(client, db, admin, moved)
    assert await listed(client, bob.headers) == [new]
    assert sorted(await listed(client, admin.headers)) == sorted([eid, lone_eid, new])


async def test_an_added_owner_sees_the_flows_executions(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    """SPEC §2: the executions of the flows the caller sees. A flow of tenant A to which an
    administrator added tenant B (or a tenantless user) as owner: B's members and that user list
    and read its executions, though they are recorded on tenant A and its first user owner; a
    member of a third tenant still sees nothing."""
    tenant_a, tenant_b, tenant_c = await factory.tenant(), await factory.tenant(), await factory.tenant()
    alice = await factory.user(tenant=tenant_a)
    bob = await factory.user(tenant=tenant_b)
    carol = await factory.user(tenant=tenant_c)
    loner = await factory.user()
    shared = await new_flow(client, alice)
    before = await run(client, db, alice, shared)
    await set_flow(db, shared, status="inactive")
    owners = [
        {"id": tenant_a, "type": "tenant"},
        {"id": alice.id, "type": "user"},
        {"id": tenant_b, "type": "tenant"},
        {"id": loner.id, "type": "user"},
    ]
    r = await client.patch(f"/flows/{shared}", json={"owners": owners}, headers=admin.headers)
    assert r.status_code == 200, r.text
    after = await run(client, db, alice, shared)
    mine = await run(client, db, bob, await new_flow(client, bob))
    assert await listed(client, bob.headers) == [mine, after, before]
    assert await listed(client, bob.headers, **{"filter[flowId]": shared}) == [after, before]
    assert await listed(client, loner.headers) == [after, before]
    assert await listed(client, alice.headers) == [after, before]
    for who in (bob, loner):
        assert (await client.get(f"/executions/{before}", headers=who.headers)).status_code == 200
        r = await client.get("/executions", headers=who.headers)
        assert r.json()["meta"]["total"] == len(r.json()["data"])
    assert await listed(client, carol.headers) == []
    assert (await client.get(f"/executions/{before}", headers=carol.headers)).status_code == 404
