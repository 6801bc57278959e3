"""Flows over HTTP, black-box, on SQLite and PostgreSQL: every endpoint, every
row of the seed's Errors table, visibility, listing and validation."""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from argon2 import PasswordHasher

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.flows import counts
from flowyard.flows.status import FlowStatus
from flowyard.flows.status import move as move_status
from flowyard.iam import passwords
from tests.conftest import Account, Factory, flow_body, force_status

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
MISSING_ID = "0123456789abcdef01234567"
MALFORMED_IDS = ["abc", "0123456789ABCDEF01234567", "0123456789abcdef0123456", "0123456789abcdef012345678"]


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The factory hashes a password per user; argon2's real cost would dominate these tests."""
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@dataclass
class World:
    admin: Account
    tenant_a: str
    tenant_b: str
    alice: Account  # member of tenant A
    anna: Account  # another member of tenant A
    bob: Account  # member of tenant B
    nobody: Account  # tenant A, no permissions at all
    reader: Account  # tenant A, may only read flows


@pytest.fixture
async def world(factory: Factory, admin: Account) -> World:
    return await make_world(factory, admin)


async def make_world(factory: Factory, admin: Account) -> World:
    """Two tenants and their members (other test modules build the same world with it)."""
    tenant_a = await factory.tenant("tenant-a")
    tenant_b = await factory.tenant("tenant-b")
    return World(
        admin=admin,
        tenant_a=tenant_a,
        tenant_b=tenant_b,
        alice=await factory.user(tenant=tenant_a),
        anna=await factory.user(tenant=tenant_a),
        bob=await factory.user(tenant=tenant_b),
        nobody=await factory.user(tenant=tenant_a, permissions=[]),
        reader=await factory.user(tenant=tenant_a, permissions=["tenant.flows.read"]),
    )


async def create(
    client: httpx.AsyncClient, who: Account, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    r = await client.post("/flows", json=body or flow_body(), headers=who.headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]


async def set_status(db: Database, flow_id: str, status: str) -> None:
    """The engine that completes starting/stopping is built elsewhere: write the state directly."""
    await force_status(db, flow_id, status)


def assert_error(r: httpx.Response, status: int, message: str | None = None) -> list[dict[str, Any]]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"errors"}, body
    assert body["errors"], body
    for item in body["errors"]:
        assert isinstance(item["message"], str) and item["message"]
        assert item["code"] == status
        assert set(item) <= {"message", "code", "field"}
    if message is not None:
        assert [e["message"] for e in body["errors"]] == [message]
    return body["errors"]


def fields_of(r: httpx.Response) -> set[str]:
    return {e.get("field", "") for e in assert_error(r, 400)}


# -- create -------------------------------------------------------------------------------------


async def test_create_returns_inactive_flow_with_owners(client: httpx.AsyncClient, world: World) -> None:
    r = await client.post("/flows", json=flow_body(cron="*/5 * * * *"), headers=world.alice.headers)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["meta"] == {}
    flow = body["data"]
    assert re.fullmatch(r"[0-9a-f]{24}", flow["id"])
    assert flow["status"] == "inactive"
    assert flow["tenant"] == world.tenant_a
    assert {"id": world.alice.id, "type": "user"} in flow["owners"]
    assert {"id": world.tenant_a, "type": "tenant"} in flow["owners"]
    assert flow["cron"] == "*/5 * * * *"
    assert flow["type"] == "ordinary"
    assert TIMESTAMP.match(flow["createdAt"]) and TIMESTAMP.match(flow["updatedAt"])
    assert flow["graph"]["nodes"][0] == {"id": "in", "componentId": "webhook", "function": "receive"}
    r = await client.get(f"/flows/{flow['id']}", headers=world.alice.headers)
    assert r.json() == {"data": flow, "meta": {}}


async def test_create_keeps_given_owners_once(client: httpx.AsyncClient, world: World) -> None:
    owners = [{"id": world.alice.id, "type": "user"}, {"id": world.anna.id, "type": "user"}]
    flow = await create(client, world.alice, flow_body(owners=owners))
    assert flow["owners"].count({"id": world.alice.id, "type": "user"}) == 1
    assert {"id": world.anna.id, "type": "user"} in flow["owners"]


async def test_create_long_running_is_stored_as_realtime(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice, flow_body(type="long_running"))
    assert flow["type"] == "realtime"
    r = await client.get(f"/flows/{flow['id']}", headers=world.alice.headers)
    assert r.json()["data"]["type"] == "realtime"


async def test_create_nested_nodes_returned_flat(client: httpx.AsyncClient, world: World) -> None:
    body = flow_body()
    body["graph"]["nodes"] = [body["graph"]["nodes"]]
    flow = await create(client, world.alice, body)
    assert [n["id"] for n in flow["graph"]["nodes"]] == ["in", "out"]
    r = await client.get(f"/flows/{flow['id']}", headers=world.alice.headers)
    assert [n["id"] for n in r.json()["data"]["graph"]["nodes"]] == ["in", "out"]


async def test_create_array_reports_per_item(client: httpx.AsyncClient, world: World) -> None:
    items = [flow_body("one"), {"name": "", "type": "weird"}, flow_body("three"), 7]
    r = await client.post("/flows", json=items, headers=world.alice.headers)
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    assert len(data) == 4
    assert data[0]["name"] == "one" and data[0]["status"] == "inactive"
    assert data[2]["name"] == "three"
    bad = {e["field"] for e in data[1]["errors"]}
    assert {"name", "type", "graph"} <= bad
    assert all(e["code"] == 400 for e in data[1]["errors"])
    assert data[3]["errors"][0]["code"] == 400
    r = await client.get("/flows", headers=world.alice.headers)
    assert sorted(f["name"] for f in r.json()["data"]) == ["one", "three"]


async def test_create_array_other_tenant_item_is_403(client: httpx.AsyncClient, world: World) -> None:
    r = await client.post(
        "/flows",
        json=[flow_body("mine"), flow_body("theirs", tenant=world.tenant_b)],
        headers=world.alice.headers,
    )
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    assert data[0]["name"] == "mine"
    assert data[1]["errors"][0]["code"] == 403


async def test_create_empty_array(client: httpx.AsyncClient, world: World) -> None:
    r = await client.post("/flows", json=[], headers=world.alice.headers)
    assert r.status_code == 201, r.text
    assert r.json() == {"data": [], "meta": {}}


async def test_create_permissions(client: httpx.AsyncClient, world: World) -> None:
    assert_error(await client.post("/flows", json=flow_body(), headers=world.nobody.headers), 403)
    assert_error(await client.post("/flows", json=[flow_body()], headers=world.reader.headers), 403)
    assert_error(await client.post("/flows", json=flow_body()), 401)
    r = await client.post("/flows", json=flow_body(tenant=world.tenant_b), headers=world.alice.headers)
    assert_error(r, 403)
    flow = await create(client, world.admin, flow_body(tenant=world.tenant_b))
    assert flow["tenant"] == world.tenant_b
    assert {"id": world.tenant_b, "type": "tenant"} in flow["owners"]
    r = await client.get(f"/flows/{flow['id']}", headers=world.bob.headers)
    assert r.status_code == 200


# -- read and visibility -----------------------------------------------------------------------


async def test_get_visibility(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    for who in (world.admin, world.alice, world.anna, world.reader):
        r = await client.get(url, headers=who.headers)
        assert r.status_code == 200, (who, r.text)
        assert r.json()["data"] == flow
    assert_error(await client.get(url, headers=world.bob.headers), 404)
    assert_error(await client.get(url, headers=world.nobody.headers), 403)
    assert_error(await client.get(url), 401)


async def test_user_without_tenant_sees_only_own_flows(
    client: httpx.AsyncClient, world: World, factory: Factory
) -> None:
    loner = await factory.user()
    other = await factory.user()
    mine = await create(client, loner)
    assert mine["owners"] == [{"id": loner.id, "type": "user"}]
    assert mine["tenant"] is None
    assert (await client.get(f"/flows/{mine['id']}", headers=loner.headers)).status_code == 200
    assert_error(await client.get(f"/flows/{mine['id']}", headers=other.headers), 404)
    assert_error(await client.get(f"/flows/{mine['id']}", headers=world.alice.headers), 404)


async def test_owners_are_only_users_the_caller_may_name(
    client: httpx.AsyncClient, world: World, factory: Factory
) -> None:
    """Attack (issue 17): a flow's first user owner takes its executions, counts and logs, so a
    non-admin names only itself (tenantless) or users of its own tenant; an id that is no local
    user is refused as well. On create (one flow or an array) and on PATCH, 403."""
    loner = await factory.user()
    other_loner = await factory.user()
    ghost = "0123456789abcdef01234567"  # no such user
    for who, refused in (
        (loner, [other_loner.id, world.alice.id, ghost, "ext-1"]),
        (world.alice, [world.bob.id, loner.id, ghost]),
    ):
        mine = await create(client, who)
        for uid in refused:
            owners = [{"id": uid, "type": "user"}]
            assert_error(await client.post("/flows", json=flow_body(owners=owners), headers=who.headers), 403)
            r = await client.post("/flows", json=[flow_body(owners=owners), flow_body()], headers=who.headers)
            assert r.status_code == 201, r.text
            first, second = r.json()["data"]
            assert first["errors"][0]["code"] == 403 and "id" in second
            r = await client.patch(f"/flows/{mine['id']}", json={"owners": owners}, headers=who.headers)
            assert_error(r, 403)
    # What a tenant member may name, and what an administrator may.
    colleague = [{"id": world.anna.id, "type": "user"}]
    assert (
        await client.post("/flows", json=flow_body(owners=colleague), headers=world.alice.headers)
    ).status_code == 201
    r = await client.post(
        "/flows", json=flow_body(owners=[{"id": ghost, "type": "user"}]), headers=world.admin.headers
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("bad", MALFORMED_IDS)
async def test_get_malformed_id_is_400(client: httpx.AsyncClient, world: World, bad: str) -> None:
    assert_error(await client.get(f"/flows/{bad}", headers=world.alice.headers), 400)


async def test_get_unknown_is_404(client: httpx.AsyncClient, world: World) -> None:
    assert_error(await client.get(f"/flows/{MISSING_ID}", headers=world.admin.headers), 404)


# -- the seed's Errors table ---------------------------------------------------------------------


async def test_errors_table_delete(client: httpx.AsyncClient, world: World, db: Database) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    assert_error(await client.delete("/flows/not-an-id", headers=world.alice.headers), 400)
    assert_error(await client.delete(f"/flows/{MISSING_ID}", headers=world.alice.headers), 404)
    assert_error(await client.delete(url, headers=world.bob.headers), 404)
    assert_error(await client.delete(url, headers=world.nobody.headers), 403)
    assert_error(await client.delete(url, headers=world.reader.headers), 403)
    for status in ("active", "starting", "stopping"):
        await set_status(db, flow["id"], status)
        r = await client.delete(url, headers=world.alice.headers)
        assert_error(r, 409, f"Flow is not inactive. Current status: {status}")
        assert (await client.get(url, headers=world.alice.headers)).status_code == 200
    await set_status(db, flow["id"], "inactive")
    r = await client.delete(url, headers=world.anna.headers)
    assert r.status_code == 200, r.text
    assert r.json() == {}
    assert_error(await client.get(url, headers=world.alice.headers), 404)
    assert_error(await client.delete(url, headers=world.alice.headers), 404)


async def test_errors_table_patch(client: httpx.AsyncClient, world: World, db: Database) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    assert_error(await client.patch("/flows/zz", json={"name": "x"}, headers=world.alice.headers), 400)
    assert_error(
        await client.patch(f"/flows/{MISSING_ID}", json={"name": "x"}, headers=world.alice.headers), 404
    )
    assert_error(await client.patch(url, json={"name": "x"}, headers=world.bob.headers), 404)
    assert_error(await client.patch(url, json={"name": "x"}, headers=world.reader.headers), 403)
    for status in ("starting", "stopping"):
        await set_status(db, flow["id"], status)
        r = await client.patch(url, json={"name": "x"}, headers=world.alice.headers)
        assert_error(r, 409, f"Flow is neither inactive nor active. Current status: {status}")
    await set_status(db, flow["id"], "inactive")
    r = await client.get(url, headers=world.alice.headers)
    assert r.json()["data"]["name"] == flow["name"]
    # An active flow may be changed (tests/api/test_active_edit.py); it stays active.
    await set_status(db, flow["id"], "active")
    r = await client.patch(url, json={"name": "x"}, headers=world.alice.headers)
    assert r.status_code == 200, r.text
    assert (r.json()["data"]["name"], r.json()["data"]["status"]) == ("x", "active")


@pytest.mark.parametrize("action", ["start", "stop"])
async def test_errors_table_start_stop(
    client: httpx.AsyncClient, world: World, db: Database, action: str
) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}/{action}"
    assert_error(await client.post(f"/flows/123/{action}", headers=world.alice.headers), 400)
    assert_error(await client.post(f"/flows/{MISSING_ID}/{action}", headers=world.alice.headers), 404)
    assert_error(await client.post(url, headers=world.nobody.headers), 403)
    assert_error(await client.post(url, headers=world.reader.headers), 403)
    assert_error(await client.post(url, headers=world.bob.headers), 404)
    assert_error(await client.post(url), 401)
    expected = "inactive" if action == "start" else "active"
    for status in ("inactive", "starting", "active", "stopping"):
        if status == expected:
            continue
        await set_status(db, flow["id"], status)
        r = await client.post(url, headers=world.alice.headers)
        assert_error(r, 409, f"Flow is not {expected}. Current status: {status}")
        got = await client.get(f"/flows/{flow['id']}", headers=world.alice.headers)
        assert got.json()["data"]["status"] == status


async def test_start_and_stop(client: httpx.AsyncClient, world: World, db: Database) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    r = await client.post(f"{url}/start", headers=world.anna.headers)
    assert r.status_code == 200, r.text
    assert r.json() == {"data": {"id": flow["id"], "status": "starting"}, "meta": {}}
    assert (await client.get(url, headers=world.alice.headers)).json()["data"]["status"] == "starting"
    await set_status(db, flow["id"], "active")
    r = await client.post(f"{url}/stop", headers=world.admin.headers)
    assert r.status_code == 200, r.text
    assert r.json() == {"data": {"id": flow["id"], "status": "stopping"}, "meta": {}}
    assert (await client.get(url, headers=world.alice.headers)).json()["data"]["status"] == "stopping"


async def test_narrowed_token_and_tenant_all(
    client: httpx.AsyncClient, world: World, db: Database, factory: Factory
) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=world.alice.headers)
    assert r.status_code == 201, r.text
    narrowed = {"Authorization": f"Bearer {r.json()['data']['token']}"}
    assert (await client.get(url, headers=narrowed)).status_code == 200
    for method, path in (("POST", f"{url}/start"), ("POST", f"{url}/stop"), ("PATCH", url), ("DELETE", url)):
        assert_error(await client.request(method, path, json={"name": "x"}, headers=narrowed), 403)
    assert_error(await client.post("/flows", json=flow_body(), headers=narrowed), 403)
    # A token that is narrowed still sees nothing outside its user's tenant.
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=world.bob.headers)
    assert_error(await client.get(url, headers={"Authorization": f"Bearer {r.json()['data']['token']}"}), 404)
    # tenant.all covers every tenant.flows.* permission, inside the own tenant only.
    boss = await factory.user(tenant=world.tenant_a, permissions=["tenant.all"])
    other_boss = await factory.user(tenant=world.tenant_b, permissions=["tenant.all"])
    assert (await client.patch(url, json={"name": "boss"}, headers=boss.headers)).status_code == 200
    assert_error(await client.patch(url, json={"name": "x"}, headers=other_boss.headers), 404)
    assert_error(await client.post(f"{url}/start", headers=other_boss.headers), 404)
    r = await client.post(f"{url}/start", headers=boss.headers)
    assert r.status_code == 200, r.text
    await set_status(db, flow["id"], "active")
    assert (await client.post(f"{url}/stop", headers=boss.headers)).status_code == 200
    await set_status(db, flow["id"], "inactive")
    assert (await client.delete(url, headers=boss.headers)).status_code == 200


# -- update ---------------------------------------------------------------------------------------


async def test_patch_replaces_given_fields(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice, flow_body(cron="0 * * * *"))
    url = f"/flows/{flow['id']}"
    await asyncio.sleep(0.01)
    new_graph = {"nodes": [{"id": "only", "componentId": "log"}], "edges": []}
    r = await client.patch(url, json={"name": "renamed", "graph": new_graph}, headers=world.anna.headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"] == {}
    got = body["data"]
    assert got["name"] == "renamed"
    assert got["graph"] == new_graph
    assert got["description"] == flow["description"]
    assert got["cron"] == "0 * * * *"
    assert got["createdAt"] == flow["createdAt"]
    assert got["updatedAt"] > flow["updatedAt"]
    assert got["status"] == "inactive"
    assert (await client.get(url, headers=world.alice.headers)).json()["data"] == got


async def test_patch_null_clears_optional_fields(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice, flow_body(cron="0 * * * *"))
    url = f"/flows/{flow['id']}"
    r = await client.patch(url, json={"description": None, "cron": None}, headers=world.alice.headers)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["description"] is None
    assert r.json()["data"]["cron"] is None
    for required in ("name", "graph", "type"):
        r = await client.patch(url, json={required: None}, headers=world.alice.headers)
        assert required in fields_of(r)


async def test_patch_nested_nodes_and_long_running(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice)
    graph = flow_body()["graph"]
    graph["nodes"] = [graph["nodes"]]
    r = await client.patch(
        f"/flows/{flow['id']}", json={"graph": graph, "type": "long_running"}, headers=world.alice.headers
    )
    assert r.status_code == 200, r.text
    assert [n["id"] for n in r.json()["data"]["graph"]["nodes"]] == ["in", "out"]
    assert r.json()["data"]["type"] == "realtime"


async def test_patch_status_field(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    r = await client.patch(
        url, json={"status": "inactive", "name": "same status"}, headers=world.alice.headers
    )
    assert r.status_code == 200, r.text
    r = await client.patch(url, json={"status": "active"}, headers=world.alice.headers)
    errors = assert_error(r, 400)
    assert errors[0]["field"] == "status"
    assert "Flow status cannot be set manually" in errors[0]["message"]
    assert (await client.get(url, headers=world.alice.headers)).json()["data"]["status"] == "inactive"


async def test_patch_read_only_fields_ignored_unknown_refused(
    client: httpx.AsyncClient, world: World
) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    r = await client.patch(
        url,
        json={"id": MISSING_ID, "createdAt": "2000-01-01T00:00:00.000Z", "name": "ok"},
        headers=world.alice.headers,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"]["id"] == flow["id"]
    assert r.json()["data"]["createdAt"] == flow["createdAt"]
    assert fields_of(await client.patch(url, json={"colour": "red"}, headers=world.alice.headers)) == {
        "colour"
    }


async def test_patch_validates_and_changes_nothing(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    r = await client.patch(url, json={"name": "", "cron": "nope", "type": "x"}, headers=world.alice.headers)
    assert fields_of(r) == {"name", "cron", "type"}
    assert (await client.get(url, headers=world.alice.headers)).json()["data"] == flow


async def test_patch_tenant_rules(client: httpx.AsyncClient, world: World) -> None:
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    assert_error(await client.patch(url, json={"tenant": world.tenant_b}, headers=world.alice.headers), 403)
    r = await client.patch(url, json={"tenant": world.tenant_b}, headers=world.admin.headers)
    assert r.status_code == 200, r.text
    assert {"id": world.tenant_b, "type": "tenant"} in r.json()["data"]["owners"]
    assert (await client.get(url, headers=world.bob.headers)).status_code == 200


async def test_non_admin_cannot_hand_a_flow_to_another_tenant(
    client: httpx.AsyncClient, world: World
) -> None:
    """Owners decide visibility, so an owner entry naming another tenant is "naming another tenant" (403)."""
    foreign = {"id": world.tenant_b, "type": "tenant"}
    r = await client.post("/flows", json=flow_body(owners=[foreign]), headers=world.alice.headers)
    assert_error(r, 403)
    flow = await create(client, world.alice)
    url = f"/flows/{flow['id']}"
    assert_error(
        await client.patch(url, json={"owners": [*flow["owners"], foreign]}, headers=world.alice.headers), 403
    )
    assert_error(await client.get(url, headers=world.bob.headers), 404)
    # Own tenant and users are fine.
    mine = {"id": world.tenant_a, "type": "tenant"}
    r = await client.patch(
        url, json={"owners": [mine, {"id": world.anna.id, "type": "user"}]}, headers=world.alice.headers
    )
    assert r.status_code == 200, r.text
    # An administrator may share it; the tenant member can still edit the flow afterwards.
    r = await client.patch(url, json={"owners": [mine, foreign]}, headers=world.admin.headers)
    assert r.status_code == 200, r.text
    assert (await client.get(url, headers=world.bob.headers)).status_code == 200
    r = await client.patch(url, json={"name": "still mine"}, headers=world.alice.headers)
    assert r.status_code == 200, r.text
    assert foreign in r.json()["data"]["owners"]


# -- validation -------------------------------------------------------------------------------------


async def test_validation_reports_every_problem(client: httpx.AsyncClient, world: World) -> None:
    body = {
        "name": "",
        "description": 5,
        "type": "sometimes",
        "cron": "61 * * * *",
        "owners": [{"id": "x", "type": "robot"}, "me"],
        "graph": {
            "nodes": [
                {"id": "a", "componentId": "no-such-component"},
                {"id": "a", "componentId": "log", "function": "nope"},
                {"componentId": "webhook", "fields": []},
            ],
            "edges": [
                {"source": "a", "target": "ghost"},
                {"source": "a", "target": "a", "config": {"condition": "$$$ (", "mapper": {"x": "a +"}}},
            ],
        },
        "extra": True,
    }
    r = await client.post("/flows", json=body, headers=world.alice.headers)
    fields = fields_of(r)
    assert {
        "name",
        "description",
        "type",
        "cron",
        "owners[0].type",
        "owners[1]",
        "graph.nodes[0].componentId",
        "graph.nodes[1].id",
        "graph.nodes[1].function",
        "graph.nodes[2].id",
        "graph.nodes[2].fields",
        "graph.edges[0].target",
        "graph.edges[1].config.condition",
        "graph.edges[1].config.mapper",
        "extra",
    } <= fields, fields


@pytest.mark.parametrize(
    ("graph", "field"),
    [
        (
            {
                "nodes": [{"id": "a"}, {"id": "b"}],
                "edges": [{"source": "a", "target": "b"}, {"source": "b", "target": "a"}],
            },
            "graph.edges",
        ),
        ({"nodes": [{"id": "a"}], "edges": [{"source": "a", "target": "a"}]}, "graph.edges"),
        ({"nodes": [{"id": "a"}], "edges": [{"source": "x", "target": "a"}]}, "graph.edges[0].source"),
        (
            {"nodes": [{"id": "a"}, {"id": "a"}], "edges": [{"source": "a", "target": "a"}]},
            "graph.nodes[1].id",
        ),
        ({"nodes": [{"id": "a"}, {"id": "b"}], "edges": []}, "graph.edges"),
        ({"nodes": [], "edges": []}, "graph.nodes"),
        ({"edges": []}, "graph.nodes"),
        ({"nodes": [{"id": "a", "componentId": "missing"}]}, "graph.nodes[0].componentId"),
        ({"nodes": [{"id": "a", "componentId": "log", "function": "shout"}]}, "graph.nodes[0].function"),
        ({"nodes": [{"id": "a", "function": "log"}]}, "graph.nodes[0].function"),
        ({"nodes": [{"id": "a", "colour": 1}]}, "graph.nodes[0].colour"),
        (
            {
                "nodes": [{"id": "a"}, {"id": "b"}],
                "edges": [{"source": "a", "target": "b", "config": {"condition": "("}}],
            },
            "graph.edges[0].config.condition",
        ),
        (
            {
                "nodes": [{"id": "a"}, {"id": "b"}],
                "edges": [{"source": "a", "target": "b", "config": {"mapper": {"k": {"deep": "]"}}}}],
            },
            "graph.edges[0].config.mapper",
        ),
        (
            {
                "nodes": [{"id": "a"}, {"id": "b"}],
                "edges": [{"source": "a", "target": "b", "config": {"mapper": "x"}}],
            },
            "graph.edges[0].config.mapper",
        ),
        ({"nodes": [{"id": "a" * 65}]}, "graph.nodes[0].id"),
        ("a graph", "graph"),
        ({"nodes": "many"}, "graph.nodes"),
    ],
)
async def test_graph_validation(client: httpx.AsyncClient, world: World, graph: Any, field: str) -> None:
    r = await client.post("/flows", json=flow_body(graph=graph), headers=world.alice.headers)
    assert field in fields_of(r)


@pytest.mark.parametrize("cron", ["* * *", "61 * * * *", "@sometimes", "* * * * * * *", "", "a b c d e", 5])
async def test_bad_cron(client: httpx.AsyncClient, world: World, cron: Any) -> None:
    assert fields_of(await client.post("/flows", json=flow_body(cron=cron), headers=world.alice.headers)) == {
        "cron"
    }


@pytest.mark.parametrize("cron", ["*/5 * * * *", "0 0 * * 1-5", "30 */5 * * * *", "@hourly", "@daily"])
async def test_good_cron(client: httpx.AsyncClient, world: World, cron: str) -> None:
    await create(client, world.alice, flow_body(cron=cron))


async def test_acyclic_diamond_and_conditions_accepted(client: httpx.AsyncClient, world: World) -> None:
    graph = {
        "nodes": [{"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "d", "componentId": "log"}],
        "edges": [
            {"source": "a", "target": "b", "config": {"condition": "amount > 10"}},
            {
                "source": "a",
                "target": "c",
                "config": {"mapper": {"total": "amount * 2", "nested": {"n": "name"}}},
            },
            {"source": "b", "target": "d"},
            {"id": "e4", "source": "c", "target": "d"},
        ],
    }
    flow = await create(client, world.alice, flow_body(graph=graph))
    assert flow["graph"]["edges"][0]["config"] == {"condition": "amount > 10"}


async def test_status_on_create(client: httpx.AsyncClient, world: World) -> None:
    assert (await create(client, world.alice, flow_body(status="inactive")))["status"] == "inactive"
    r = await client.post("/flows", json=flow_body(status="active"), headers=world.alice.headers)
    assert fields_of(r) == {"status"}


async def test_length_limits(client: httpx.AsyncClient, world: World) -> None:
    await create(client, world.alice, flow_body("n" * 200, description="d" * 5000))
    r = await client.post(
        "/flows", json=flow_body("n" * 201, description="d" * 5001), headers=world.alice.headers
    )
    assert fields_of(r) == {"name", "description"}


# -- listing ------------------------------------------------------------------------------------------


async def test_list_visibility_and_user_filter(client: httpx.AsyncClient, world: World) -> None:
    a1 = await create(client, world.alice, flow_body("a1"))
    a2 = await create(client, world.anna, flow_body("a2"))
    b1 = await create(client, world.bob, flow_body("b1"))

    async def ids(who: Account, query: str = "") -> tuple[list[str], int]:
        r = await client.get(f"/flows{query}", headers=who.headers)
        assert r.status_code == 200, r.text
        return [f["id"] for f in r.json()["data"]], r.json()["meta"]["total"]

    assert await ids(world.admin) == (sorted([a1["id"], a2["id"], b1["id"]]), 3)
    assert await ids(world.alice) == (sorted([a1["id"], a2["id"]]), 2)
    assert await ids(world.bob) == ([b1["id"]], 1)
    # filter[user] only narrows what the caller may see.
    assert await ids(world.bob, f"?filter[user]={world.alice.id}") == ([], 0)
    assert await ids(world.alice, f"?filter[user]={world.anna.id}") == ([a2["id"]], 1)
    assert await ids(world.alice, f"?filter[user]={world.bob.id}") == ([], 0)
    assert await ids(world.admin, f"?filter[user]={world.bob.id}") == ([b1["id"]], 1)
    assert_error(await client.get("/flows", headers=world.nobody.headers), 403)
    assert_error(await client.get("/flows"), 401)


async def test_list_paging(client: httpx.AsyncClient, world: World) -> None:
    r = await client.post(
        "/flows", json=[flow_body(f"flow {i:02d}") for i in range(23)], headers=world.alice.headers
    )
    all_ids = sorted(f["id"] for f in r.json()["data"])
    r = await client.get("/flows", headers=world.alice.headers)
    assert r.json()["meta"] == {"page": 1, "perPage": 10, "total": 23, "totalPages": 3, "totalExact": True}
    assert [f["id"] for f in r.json()["data"]] == all_ids[:10]
    for size, number in [(5, 1), (5, 5), (7, 4), (23, 1), (1000, 1), (1, 23), (10, 3)]:
        r = await client.get(f"/flows?page[size]={size}&page[number]={number}", headers=world.alice.headers)
        assert r.status_code == 200, r.text
        assert [f["id"] for f in r.json()["data"]] == all_ids[(number - 1) * size : number * size]
        assert r.json()["meta"] == {
            "page": number,
            "perPage": size,
            "total": 23,
            "totalPages": math.ceil(23 / size),
            "totalExact": True,
        }
    r = await client.get("/flows?page[number]=4", headers=world.alice.headers)
    assert r.status_code == 200
    assert r.json() == {
        "data": [],
        "meta": {"page": 4, "perPage": 10, "total": 23, "totalPages": 3, "totalExact": True},
    }
    r = await client.get("/flows?page[number]=1000000000", headers=world.alice.headers)
    assert r.status_code == 200
    assert r.json()["data"] == []


async def test_list_empty(client: httpx.AsyncClient, world: World) -> None:
    r = await client.get("/flows", headers=world.alice.headers)
    assert r.json() == {
        "data": [],
        "meta": {"page": 1, "perPage": 10, "total": 0, "totalPages": 0, "totalExact": True},
    }


@pytest.mark.parametrize(
    "query",
    [
        "page[size]=0",
        "page[size]=1001",
        "page[size]=-1",
        "page[size]=abc",
        "page[size]=1.5",
        "page[size]=",
        "page[number]=0",
        "page[number]=-3",
        "page[number]=x",
        "page[number]=1e3",
        "page[number]=99999999999999999999999",
        "page[number]=1000000001",
        "page[offset]=2",
        "filter[x]=1",
        "filter[Status]=active",
        "filter[status]=running",
        "filter[status]=2",
        "filter[type]=fast",
        "filter[user]=",
        "filter[status]=active&filter[status]=inactive",
        "sort=id",
        "sort=-",
        "sort=+name",
        "sort=name,createdAt",
        "sort=--name",
        "sort=",
        "search=" + "x" * 501,
        "page[size]=10&page[size]=20",
        "page[number]=1&page[number]=1",
        "sort=name&sort=-name",
        "search=a&search=b",
    ],
)
async def test_list_bad_query_is_400(client: httpx.AsyncClient, world: World, query: str) -> None:
    assert_error(await client.get(f"/flows?{query}", headers=world.alice.headers), 400)


async def test_list_filters(client: httpx.AsyncClient, world: World, db: Database) -> None:
    f1 = await create(client, world.alice, flow_body("one", type="ordinary"))
    f2 = await create(client, world.alice, flow_body("two", type="realtime"))
    f3 = await create(client, world.alice, flow_body("three", type="long_running"))
    f4 = await create(client, world.alice, flow_body("four"))
    await set_status(db, f1["id"], "active")
    await set_status(db, f3["id"], "active")
    await set_status(db, f4["id"], "starting")

    async def ids(query: str) -> tuple[list[str], int]:
        r = await client.get(f"/flows?{query}", headers=world.alice.headers)
        assert r.status_code == 200, r.text
        meta = r.json()["meta"]
        assert meta["totalPages"] == math.ceil(meta["total"] / meta["perPage"])
        return [f["id"] for f in r.json()["data"]], meta["total"]

    assert await ids("filter[status]=active") == (sorted([f1["id"], f3["id"]]), 2)
    assert await ids("filter[status]=1") == (sorted([f1["id"], f3["id"]]), 2)
    assert await ids("filter[status]=inactive") == ([f2["id"]], 1)
    assert await ids("filter[status]=0") == ([f2["id"]], 1)
    assert await ids("filter[status]=starting") == ([f4["id"]], 1)
    assert await ids("filter[status]=stopping") == ([], 0)
    assert await ids("filter[type]=long_running") == (sorted([f2["id"], f3["id"]]), 2)
    assert await ids("filter[type]=realtime") == (sorted([f2["id"], f3["id"]]), 2)
    assert await ids("filter[type]=ordinary") == (sorted([f1["id"], f4["id"]]), 2)
    assert await ids("filter[type]=realtime&filter[status]=1") == ([f3["id"]], 1)
    assert await ids("filter[type]=ordinary&filter[status]=active&page[size]=1") == ([f1["id"]], 1)
    assert await ids(f"filter[user]={world.alice.id}&filter[status]=active&page[size]=1&page[number]=2") == (
        [max(f1["id"], f3["id"])],
        2,
    )


async def test_list_sort(client: httpx.AsyncClient, world: World, db: Database) -> None:
    names = ["delta", "alpha", "charlie", "bravo"]
    flows = [await create(client, world.alice, flow_body(n)) for n in names]
    created = ["2026-01-03 00:00:00", "2026-01-01 00:00:00", "2026-01-01 00:00:00", "2026-01-02 00:00:00"]
    async with db.write() as session:
        for flow, stamp in zip(flows, created, strict=True):
            await session.execute(
                sa.text("UPDATE flows SET created_at = :c WHERE id = :i"),
                {"c": _stamp(db, stamp), "i": flow["id"]},
            )
    by_name = {f["name"]: f["id"] for f in flows}
    tie = sorted([by_name["alpha"], by_name["charlie"]])

    async def order(sort: str) -> list[str]:
        r = await client.get(f"/flows?sort={sort}", headers=world.alice.headers)
        assert r.status_code == 200, r.text
        return [f["id"] for f in r.json()["data"]]

    assert await order("name") == [by_name[n] for n in sorted(names)]
    assert await order("-name") == [by_name[n] for n in sorted(names, reverse=True)]
    assert await order("createdAt") == [*tie, by_name["bravo"], by_name["delta"]]
    # Descending reverses the property only: ties stay by id ascending.
    assert await order("-createdAt") == [by_name["delta"], by_name["bravo"], *tie]
    await asyncio.sleep(0.01)
    r = await client.patch(f"/flows/{by_name['bravo']}", json={"name": "bravo2"}, headers=world.alice.headers)
    assert r.status_code == 200
    assert (await order("-updatedAt"))[0] == by_name["bravo"]
    assert (await order("updatedAt"))[-1] == by_name["bravo"]
    r = await client.get("/flows?sort=name&page[size]=2&page[number]=2", headers=world.alice.headers)
    assert [f["name"] for f in r.json()["data"]] == ["charlie", "delta"]


def _stamp(db: Database, text: str) -> Any:
    from datetime import UTC, datetime

    value = datetime.fromisoformat(text).replace(tzinfo=UTC)
    # SQLite stores naive UTC text; PostgreSQL takes an aware timestamp.
    return value.replace(tzinfo=None).isoformat(sep=" ") if db.is_sqlite else value


async def test_list_search(client: httpx.AsyncClient, world: World) -> None:
    specs = {
        "über": ("Über Flow", None),
        "plain": ("Plain", "Talks to the ÜBER-API"),
        "percent": ("100% done", None),
        "under": ("snake_case", None),
        "other": ("Nothing here", "boring"),
        "regex": ("a.b*c", "x"),
        "slash": ("back\\slash", None),
    }
    ids = {}
    for key, (name, desc) in specs.items():
        body = flow_body(name)
        body["description"] = desc
        ids[key] = (await create(client, world.alice, body))["id"]

    async def found(term: str) -> list[str]:
        r = await client.get("/flows", params={"search": term}, headers=world.alice.headers)
        assert r.status_code == 200, r.text
        assert r.json()["meta"]["total"] == len(r.json()["data"])
        return sorted(k for k, v in ids.items() if v in {f["id"] for f in r.json()["data"]})

    assert await found("über") == ["plain", "über"]
    assert await found("ÜBER") == ["plain", "über"]
    assert await found("Über flow") == ["über"]
    assert await found("%") == ["percent"]
    assert await found("0%") == ["percent"]
    assert await found("_") == ["under"]
    assert await found("e_c") == ["under"]
    assert await found("a.b*") == ["regex"]
    assert await found(".") == ["regex"]
    assert await found("\\") == ["slash"]
    assert await found("BORING") == ["other"]
    assert await found("zzz") == []
    r = await client.get("/flows", params={"search": "ü", "page[size]": 1}, headers=world.alice.headers)
    assert r.json()["meta"] == {"page": 1, "perPage": 1, "total": 2, "totalPages": 2, "totalExact": True}
    r = await client.get("/flows", params={"search": "über"}, headers=world.bob.headers)
    assert r.json()["meta"]["total"] == 0


# -- concurrency ---------------------------------------------------------------------------------------


async def _race(
    clients: list[httpx.AsyncClient], dbs: list[Database], who: Account, flow_id: str, rounds: int
) -> None:
    """Many concurrent PATCH/start/stop/DELETE on one flow, with an engine stand-in completing
    starting→active and stopping→inactive; checks every answer and the final state."""
    import random

    rng = random.Random(flow_id)
    url = f"/flows/{flow_id}"
    ops: list[tuple[str, Any]] = []
    for i in range(rounds):
        kind = rng.choice(["patch", "patch", "start", "start", "stop", "stop", "get", "delete"])
        client = clients[i % len(clients)]
        if kind == "patch":
            ops.append((kind, client.patch(url, json={"name": f"name {i}"}, headers=who.headers)))
        elif kind == "delete":
            ops.append((kind, client.delete(url, headers=who.headers)))
        elif kind == "get":
            ops.append((kind, client.get(url, headers=who.headers)))
        else:
            ops.append((kind, client.post(f"{url}/{kind}", headers=who.headers)))
    done = False

    async def engine(database: Database) -> None:
        while not done:
            async with database.write() as session:
                for src, dst in (
                    (FlowStatus.STARTING, FlowStatus.ACTIVE),
                    (FlowStatus.STOPPING, FlowStatus.INACTIVE),
                ):
                    await move_status(session, flow_id, src, dst, at=utcnow())
            await asyncio.sleep(0.002)

    engines = [asyncio.create_task(engine(d)) for d in dbs]
    try:
        responses = await asyncio.gather(*(coro for _, coro in ops))
    finally:
        done = True
        await asyncio.gather(*engines)
    outcome: dict[str, list[int]] = {}
    for (kind, _), r in zip(ops, responses, strict=True):
        assert r.status_code in (200, 404, 409), (kind, r.status_code, r.text)
        if r.status_code != 200:
            assert_error(r, r.status_code)
        outcome.setdefault(kind, []).append(r.status_code)
        if kind == "patch" and r.status_code == 200:
            # Changed while inactive or active (never in transit), and left as it was.
            assert r.json()["data"]["status"] in ("inactive", "active")
        if kind in ("start", "stop") and r.status_code == 200:
            assert r.json()["data"]["status"] == ("starting" if kind == "start" else "stopping")
    deleted = outcome.get("delete", []).count(200)
    assert deleted <= 1
    starts, stops = outcome.get("start", []).count(200), outcome.get("stop", []).count(200)
    # Every stop needs an earlier start (active only comes from starting).
    assert stops <= starts <= stops + 1
    final = await clients[0].get(url, headers=who.headers)
    async with dbs[0].read() as session:
        owner_rows = (
            await session.execute(
                sa.text("SELECT count(*) FROM flow_owners WHERE flow_id = :i"), {"i": flow_id}
            )
        ).scalar_one()
    if deleted:
        assert_error(final, 404)
        assert owner_rows == 0
    else:
        flow = final.json()["data"]
        assert flow["status"] == ("active" if starts > stops else "inactive")
        assert owner_rows == len(flow["owners"])
        patched = {
            f"name {i}"
            for i, ((kind, _), r) in enumerate(zip(ops, responses, strict=True))
            if kind == "patch" and r.status_code == 200
        }
        assert flow["name"] in patched | {"racy"}
    async with dbs[0].read() as session:  # every move and the delete counted once, racing or not
        assert await counts.drift(session) == {}


async def test_concurrent_commands_on_one_flow(client: httpx.AsyncClient, world: World, db: Database) -> None:
    for _ in range(3):
        flow = await create(client, world.alice, flow_body("racy"))
        await _race([client], [db], world.alice, flow["id"], rounds=60)


async def test_concurrent_commands_across_processes(
    app: Any, client: httpx.AsyncClient, world: World, db: Database, db_url: str, settings: Any, registry: Any
) -> None:
    """Separate Database instances (as separate API processes would have) racing, on PostgreSQL
    and on SQLite (the processes of a multi-process `serve` share its file)."""
    from flowyard.app import create_app

    others = [Database(db_url) for _ in range(3)]
    clients = [client]
    try:
        for other in others:
            other_app = create_app(settings, db=other, registry=registry, run_engine=False)
            clients.append(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=other_app), base_url="http://t")
            )
        for _ in range(3):
            flow = await create(client, world.alice, flow_body("racy"))
            await _race(clients, [db, *others], world.alice, flow["id"], rounds=80)
    finally:
        for c in clients[1:]:
            await c.aclose()
        for other in others:
            await other.dispose()


async def test_non_admin_can_only_add_own_tenants_users_as_owners(
    client: httpx.AsyncClient, factory: Factory
) -> None:
    t1, t2 = await factory.tenant(), await factory.tenant()
    alice, colleague, outsider = (
        await factory.user(tenant=t1),
        await factory.user(tenant=t1),
        await factory.user(tenant=t2),
    )
    body = flow_body(owners=[{"id": outsider.id, "type": "user"}])
    r = await client.post("/flows", json=body, headers=alice.headers)
    assert r.status_code == 403 and outsider.id in r.json()["errors"][0]["message"]
    assert (await client.get("/flows", headers=outsider.headers)).json()["meta"]["total"] == 0
    r = await client.post(
        "/flows", json=[body, flow_body(owners=[{"id": colleague.id, "type": "user"}])], headers=alice.headers
    )
    assert r.status_code == 201
    first, second = r.json()["data"]
    assert first["errors"][0]["code"] == 403 and second["id"]
    r = await client.patch(
        f"/flows/{second['id']}",
        json={"owners": [{"id": outsider.id, "type": "user"}]},
        headers=alice.headers,
    )
    assert r.status_code == 403
