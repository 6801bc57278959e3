"""Flow templates over HTTP, on SQLite and PostgreSQL: visibility, filters,
admin writes, flows made from templates, and the import used by the CLI."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.errors import InvalidInput
from flowyard.templates import service as template_service
from tests.conftest import Account, Factory, flow_body

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
MISSING = "0123456789abcdef01234567"


def tpl(name: str = "Order sync", **extra: Any) -> dict[str, Any]:
    body = flow_body(name)
    del body["description"]  # its "forwards orders" would match every search test
    body.update(extra)
    return body


async def create(
    client: httpx.AsyncClient, admin: Account, name: str = "Order sync", **extra: Any
) -> dict[str, Any]:
    r = await client.post("/templates", json=tpl(name, **extra), headers=admin.headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


async def ids_of(
    client: httpx.AsyncClient, who: Account, query: str = ""
) -> tuple[list[str], dict[str, Any]]:
    r = await client.get(f"/templates{query}", headers=who.headers)
    assert r.status_code == 200, r.text
    body = r.json()
    return [t["id"] for t in body["data"]], body["meta"]


async def status_of(client: httpx.AsyncClient, who: Account, query: str) -> int:
    return (await client.get(f"/templates{query}", headers=who.headers)).status_code


# -- admin writes ------------------------------------------------------------------


async def test_create_read_update_delete(client: httpx.AsyncClient, admin: Account) -> None:
    body = tpl(
        "Order sync",
        description="Copies orders",
        cron="*/5 * * * *",
        status="published",
        tags=["erp", "orders", "erp"],
        owners=[{"id": "tenant-x", "type": "tenant"}],
    )
    r = await client.post("/templates", json=body, headers=admin.headers)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["meta"] == {}
    t = created["data"]
    assert set(t) == {
        "id",
        "name",
        "description",
        "graph",
        "type",
        "cron",
        "owners",
        "status",
        "tags",
        "shared",
        "createdAt",
        "updatedAt",
    }
    assert re.fullmatch(r"[0-9a-f]{24}", t["id"])
    assert t["name"] == "Order sync"
    assert t["status"] == "published"
    assert t["tags"] == ["erp", "orders"]
    assert t["owners"] == [{"id": "tenant-x", "type": "tenant"}]
    assert t["cron"] == "*/5 * * * *"
    assert t["graph"] == body["graph"]
    assert TS.match(t["createdAt"]) and TS.match(t["updatedAt"])

    r = await client.get(f"/templates/{t['id']}", headers=admin.headers)
    assert r.status_code == 200
    assert r.json() == {"data": t, "meta": {}}

    r = await client.patch(
        f"/templates/{t['id']}",
        json={
            "name": "Order sync v2",
            "description": None,
            "tags": ["crm"],
            "status": "draft",
            "id": "ignored",
        },
        headers=admin.headers,
    )
    assert r.status_code == 200, r.text
    p = r.json()["data"]
    assert p["id"] == t["id"]
    assert (p["name"], p["description"], p["tags"], p["status"]) == ("Order sync v2", None, ["crm"], "draft")
    assert p["graph"] == t["graph"] and p["cron"] == t["cron"] and p["owners"] == t["owners"]
    assert p["createdAt"] == t["createdAt"]
    assert p["updatedAt"] >= t["updatedAt"]

    r = await client.delete(f"/templates/{t['id']}", headers=admin.headers)
    assert (r.status_code, r.json()) == (200, {})
    assert (await client.get(f"/templates/{t['id']}", headers=admin.headers)).status_code == 404
    assert (await client.delete(f"/templates/{t['id']}", headers=admin.headers)).status_code == 404
    assert (await client.patch(f"/templates/{t['id']}", json={}, headers=admin.headers)).status_code == 404


async def test_long_running_is_stored_as_realtime(client: httpx.AsyncClient, admin: Account) -> None:
    t = await create(client, admin, type="long_running")
    assert t["type"] == "realtime"
    assert t["status"] == "draft" and t["tags"] == [] and t["shared"] is False


async def test_create_reports_every_problem(client: httpx.AsyncClient, admin: Account) -> None:
    body = {
        "type": "batch",
        "tenant": "t1",
        "status": "live",
        "tags": ["ok", 3],
        "cron": "not a cron",
        "graph": {"nodes": [{"id": "a", "componentId": "nope"}]},
    }
    r = await client.post("/templates", json=body, headers=admin.headers)
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert all(e["code"] == 400 for e in errors)
    assert {e.get("field") for e in errors} >= {
        "name",
        "type",
        "tenant",
        "status",
        "tags",
        "cron",
        "graph.nodes[0].componentId",
    }


async def test_patch_validates_the_result(client: httpx.AsyncClient, admin: Account) -> None:
    t = await create(client, admin)
    r = await client.patch(f"/templates/{t['id']}", json={"name": None, "type": "x"}, headers=admin.headers)
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {"name", "type"}
    r = await client.patch(f"/templates/{t['id']}", json=[1], headers=admin.headers)
    assert r.status_code == 400
    assert (await client.get(f"/templates/{t['id']}", headers=admin.headers)).json()["data"] == t


async def test_bodies_must_be_json(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post(
        "/templates", content=b"name=x", headers={**admin.headers, "Content-Type": "text/plain"}
    )
    assert r.status_code == 415
    assert r.json()["errors"][0]["code"] == 415
    r = await client.post(
        "/templates", content=b"{not json", headers={**admin.headers, "Content-Type": "application/json"}
    )
    assert r.status_code == 400


async def test_writes_need_all(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant, permissions=["flowTemplates.read", "tenant.all"])
    t = await create(client, admin)
    assert (await client.post("/templates", json=tpl(), headers=member.headers)).status_code == 403
    assert (
        await client.patch(f"/templates/{t['id']}", json={"name": "x"}, headers=member.headers)
    ).status_code == 403
    assert (await client.delete(f"/templates/{t['id']}", headers=member.headers)).status_code == 403
    assert (await client.get(f"/templates/{t['id']}", headers=admin.headers)).json()["data"] == t


async def test_malformed_and_unknown_ids(client: httpx.AsyncClient, admin: Account) -> None:
    for bad in ("abc", "0123456789ABCDEF01234567", "0123456789abcdef0123456z"):
        assert (await client.get(f"/templates/{bad}", headers=admin.headers)).status_code == 400
        assert (await client.patch(f"/templates/{bad}", json={}, headers=admin.headers)).status_code == 400
        assert (await client.delete(f"/templates/{bad}", headers=admin.headers)).status_code == 400
        assert (
            await client.post(f"/templates/{bad}/flows", json={}, headers=admin.headers)
        ).status_code == 400
    assert (await client.get(f"/templates/{MISSING}", headers=admin.headers)).status_code == 404
    assert (
        await client.post(f"/templates/{MISSING}/flows", json={}, headers=admin.headers)
    ).status_code == 404


async def test_authentication_required(client: httpx.AsyncClient) -> None:
    for method, path in (("GET", "/templates"), ("GET", f"/templates/{MISSING}"), ("POST", "/templates")):
        r = await client.request(method, path)
        assert r.status_code == 401
        assert r.json()["errors"][0]["code"] == 401


# -- visibility --------------------------------------------------------------------


@dataclass
class World:
    alice: Account  # tenant A
    bob: Account  # tenant A
    carol: Account  # tenant B
    loner: Account  # no tenant
    reader_without_perm: Account  # tenant A, no flowTemplates.read
    glob: str  # no owners, shared: every holder of flowTemplates.read
    hidden: str  # no owners, not shared: administrators only
    mine: str  # created without owners: the creating administrator's
    tenant_a: str
    alice_own: str
    bob_own: str
    tenant_b: str
    carol_own: str


@pytest.fixture
async def world(client: httpx.AsyncClient, admin: Account, factory: Factory) -> World:
    a = await factory.tenant("A")
    b = await factory.tenant("B")
    alice = await factory.user(tenant=a)
    bob = await factory.user(tenant=a)
    carol = await factory.user(tenant=b)
    loner = await factory.user()
    nope = await factory.user(tenant=a, permissions=["tenant.flows.read", "tenant.flows.create"])

    async def make(name: str, owners: list[dict[str, str]], **extra: Any) -> str:
        return (await create(client, admin, name, owners=owners, **extra))["id"]

    mine = await create(client, admin, "mine")
    assert mine["owners"] == [{"id": admin.id, "type": "user"}] and mine["shared"] is False

    return World(
        alice=alice,
        bob=bob,
        carol=carol,
        loner=loner,
        reader_without_perm=nope,
        glob=await make("global", [], shared=True),
        hidden=await make("hidden", []),
        mine=mine["id"],
        tenant_a=await make("tenant a", [{"id": a, "type": "tenant"}]),
        alice_own=await make("alice", [{"id": alice.id, "type": "user"}]),
        bob_own=await make("bob", [{"id": bob.id, "type": "user"}, {"id": a, "type": "tenant"}]),
        tenant_b=await make("tenant b", [{"id": b, "type": "tenant"}]),
        carol_own=await make("carol", [{"id": carol.id, "type": "user"}]),
    )


async def narrowed(client: httpx.AsyncClient, who: Account, permissions: list[str]) -> Account:
    r = await client.post(
        "/tokens", json={"description": "narrowed", "permissions": permissions}, headers=who.headers
    )
    assert r.status_code == 201, r.text
    return Account(who.id, who.username, r.json()["data"]["token"], who.tenant, who.password)


async def test_visibility(client: httpx.AsyncClient, admin: Account, world: World) -> None:
    """SPEC §4: owners (the user or its tenant) or ``shared``; ownerless and unshared is for
    ``all`` only. Another tenant's member, a tenantless user and a narrowed token each see
    exactly their set, in lists and by id."""
    w = world
    everything = sorted(
        [w.glob, w.hidden, w.mine, w.tenant_a, w.alice_own, w.bob_own, w.tenant_b, w.carol_own]
    )
    admin_reader = await narrowed(client, admin, ["flowTemplates.read"])  # no longer `all`
    alice_reader = await narrowed(client, w.alice, ["flowTemplates.read"])
    expected = {
        "admin": (admin, everything),
        "alice": (w.alice, sorted([w.glob, w.tenant_a, w.alice_own, w.bob_own])),
        "alice narrowed": (alice_reader, sorted([w.glob, w.tenant_a, w.alice_own, w.bob_own])),
        "bob": (w.bob, sorted([w.glob, w.tenant_a, w.bob_own])),
        "carol": (w.carol, sorted([w.glob, w.tenant_b, w.carol_own])),
        "loner": (w.loner, [w.glob]),
        "admin narrowed": (admin_reader, sorted([w.glob, w.mine])),
    }
    for name, (who, ids) in expected.items():
        got, meta = await ids_of(client, who)
        assert got == ids, name
        assert meta == {"page": 1, "perPage": 10, "total": len(ids), "totalPages": 1}, name
        for tid in everything:
            r = await client.get(f"/templates/{tid}", headers=who.headers)
            assert r.status_code == (200 if tid in ids else 404), (name, tid)
            if r.status_code == 404:
                assert "not found" in r.json()["errors"][0]["message"]
    # A token narrowed to another permission reads no template at all.
    flows_only = await narrowed(client, w.alice, ["tenant.flows.read"])
    assert (await client.get("/templates", headers=flows_only.headers)).status_code == 403
    assert (await client.get(f"/templates/{w.glob}", headers=flows_only.headers)).status_code == 403


async def test_sharing_is_switched_by_patch(client: httpx.AsyncClient, admin: Account, world: World) -> None:
    w = world
    assert (await client.get(f"/templates/{w.hidden}", headers=w.carol.headers)).status_code == 404
    r = await client.patch(f"/templates/{w.hidden}", json={"shared": True}, headers=admin.headers)
    assert r.status_code == 200 and r.json()["data"]["shared"] is True
    for who in (w.alice, w.carol, w.loner):
        assert (await client.get(f"/templates/{w.hidden}", headers=who.headers)).status_code == 200
    r = await client.patch(f"/templates/{w.hidden}", json={"shared": False}, headers=admin.headers)
    assert r.status_code == 200 and r.json()["data"]["shared"] is False
    assert (await client.get(f"/templates/{w.hidden}", headers=w.loner.headers)).status_code == 404
    r = await client.patch(f"/templates/{w.hidden}", json={"shared": "yes"}, headers=admin.headers)
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "shared"


async def test_flows_only_from_visible_templates(
    client: httpx.AsyncClient, admin: Account, world: World
) -> None:
    w = world
    for tid in (w.hidden, w.mine, w.tenant_b):
        r = await client.post(f"/templates/{tid}/flows", json={}, headers=w.alice.headers)
        assert r.status_code == 404, tid
    r = await client.post(f"/templates/{w.glob}/flows", json={}, headers=w.loner.headers)
    assert r.status_code == 201, r.text


async def test_read_needs_permission(client: httpx.AsyncClient, world: World) -> None:
    who = world.reader_without_perm
    assert (await client.get("/templates", headers=who.headers)).status_code == 403
    r = await client.get(f"/templates/{world.glob}", headers=who.headers)
    assert r.status_code == 403
    assert r.json() == {"errors": [{"message": "Missing permission flowTemplates.read.", "code": 403}]}


async def test_filter_user(client: httpx.AsyncClient, admin: Account, world: World) -> None:
    w = world
    # Admins may filter by anyone; every filter only narrows what the caller sees.
    assert (await ids_of(client, admin, f"?filter[user]={w.carol.id}"))[0] == [w.carol_own]
    assert (await ids_of(client, w.alice, f"?filter[user]={w.alice.id}"))[0] == [w.alice_own]
    assert (await ids_of(client, w.alice, f"?filter[user]={w.bob.id}"))[0] == [w.bob_own]
    assert (await ids_of(client, w.bob, f"?filter[user]={w.alice.id}"))[0] == []
    assert (await ids_of(client, w.loner, f"?filter[user]={w.loner.id}"))[0] == []
    assert await status_of(client, w.carol, f"?filter[user]={w.alice.id}") == 403
    assert await status_of(client, w.alice, f"?filter[user]={MISSING}") == 403
    assert await status_of(client, w.loner, f"?filter[user]={w.alice.id}") == 403
    assert await status_of(client, w.alice, "?filter[user]=") == 400
    assert await status_of(client, w.alice, "?filter[user]=" + "x" * 65) == 400


# -- filters, tags, sort, search, paging ---------------------------------------------


@dataclass
class Catalogue:
    ids: dict[str, str]  # name -> id, in creation order


@pytest.fixture
async def catalogue(client: httpx.AsyncClient, admin: Account) -> Catalogue:
    specs: list[tuple[str, dict[str, Any]]] = [
        ("Order sync", {"status": "published", "tags": ["erp", "orders"], "description": "ERP to shop"}),
        ("alpha", {"status": "draft", "tags": ["crm"]}),
        ("100% done", {"status": "published", "tags": []}),
        ("under_score", {"status": "draft", "description": "Handles ORDERS nightly"}),
        ("Zeta", {"status": "published", "tags": ["crm", "erp"]}),
        ("Ünïcode ORDER", {"status": "draft", "tags": ["misc"]}),
    ]
    ids = {}
    for name, extra in specs:
        ids[name] = (await create(client, admin, name, **extra))["id"]
    return Catalogue(ids)


def by_id(c: Catalogue, *names: str) -> list[str]:
    return sorted(c.ids[n] for n in names)


async def test_status_filter(client: httpx.AsyncClient, admin: Account, catalogue: Catalogue) -> None:
    c = catalogue
    published = by_id(c, "Order sync", "100% done", "Zeta")
    draft = by_id(c, "alpha", "under_score", "Ünïcode ORDER")
    for value, want in (("1", published), ("published", published), ("0", draft), ("draft", draft)):
        got, meta = await ids_of(client, admin, f"?filter[status]={value}")
        assert got == want, value
        assert meta["total"] == 3
    for bad in ("2", "active", "", "Published"):
        r = await client.get(f"/templates?filter[status]={bad}", headers=admin.headers)
        assert r.status_code == 400, bad
        assert r.json()["errors"][0]["field"] == "filter[status]"


async def test_tags(client: httpx.AsyncClient, admin: Account, catalogue: Catalogue) -> None:
    c = catalogue
    untagged = ["100% done", "under_score"]
    assert (await ids_of(client, admin, "?tags=erp"))[0] == by_id(c, "Order sync", "Zeta", *untagged)
    assert (await ids_of(client, admin, "?tags=crm"))[0] == by_id(c, "alpha", "Zeta", *untagged)
    assert (await ids_of(client, admin, "?tags=crm,misc"))[0] == by_id(
        c, "alpha", "Zeta", "Ünïcode ORDER", *untagged
    )
    assert (await ids_of(client, admin, "?tags=crm&tags=orders"))[0] == by_id(
        c, "alpha", "Zeta", "Order sync", *untagged
    )
    got, meta = await ids_of(client, admin, "?tags=nothing")
    assert got == by_id(c, *untagged) and meta["total"] == 2
    assert await status_of(client, admin, "?tags=") == 400
    assert await status_of(client, admin, "?tags=,,") == 400
    assert await status_of(client, admin, "?tags=" + "x" * 101) == 400


async def test_search(client: httpx.AsyncClient, admin: Account, catalogue: Catalogue) -> None:
    c = catalogue
    assert (await ids_of(client, admin, "?search=order"))[0] == by_id(
        c, "Order sync", "under_score", "Ünïcode ORDER"
    )
    assert (await ids_of(client, admin, "?search=ERP"))[0] == by_id(c, "Order sync")
    assert (await ids_of(client, admin, "?search=%25"))[0] == by_id(c, "100% done")
    assert (await ids_of(client, admin, "?search=_"))[0] == by_id(c, "under_score")
    assert (await ids_of(client, admin, "?search=ünï"))[0] == by_id(c, "Ünïcode ORDER")
    assert (await ids_of(client, admin, "?search=.*"))[0] == []
    assert await status_of(client, admin, "?search=" + "x" * 501) == 400


async def test_sort(client: httpx.AsyncClient, admin: Account, catalogue: Catalogue) -> None:
    c = catalogue
    size = "&page[size]=100"
    created = list(c.ids.values())
    assert (await ids_of(client, admin, "?sort=createdAt" + size))[0] == created
    assert (await ids_of(client, admin, "?sort=-createdAt" + size))[0] == created[::-1]
    names = sorted(c.ids)  # binary order, as both test databases collate
    assert (await ids_of(client, admin, "?sort=name" + size))[0] == [c.ids[n] for n in names]
    assert (await ids_of(client, admin, "?sort=-name" + size))[0] == [c.ids[n] for n in names[::-1]]
    r = await client.patch(f"/templates/{c.ids['alpha']}", json={"tags": []}, headers=admin.headers)
    assert r.status_code == 200
    got = (await ids_of(client, admin, "?sort=-updatedAt" + size))[0]
    assert got[0] == c.ids["alpha"]
    for bad in ("id", "-", "+name", "name,createdAt", "--name"):
        r = await client.get("/templates", params={"sort": bad}, headers=admin.headers)
        assert r.status_code == 400, bad
        assert r.json()["errors"][0]["field"] == "sort"


async def test_sort_ties_break_by_id(client: httpx.AsyncClient, admin: Account) -> None:
    ids = [(await create(client, admin, "same"))["id"] for _ in range(4)]
    assert (await ids_of(client, admin, "?sort=name"))[0] == sorted(ids)
    assert (await ids_of(client, admin, "?sort=-name"))[0] == sorted(ids)


async def test_paging(client: httpx.AsyncClient, admin: Account, catalogue: Catalogue) -> None:
    all_ids = sorted(catalogue.ids.values())
    got, meta = await ids_of(client, admin, "?page[size]=4")
    assert got == all_ids[:4]
    assert meta == {"page": 1, "perPage": 4, "total": 6, "totalPages": 2}
    got, meta = await ids_of(client, admin, "?page[size]=4&page[number]=2")
    assert got == all_ids[4:]
    assert meta == {"page": 2, "perPage": 4, "total": 6, "totalPages": 2}
    got, meta = await ids_of(client, admin, "?page[size]=4&page[number]=3")
    assert got == [] and meta["total"] == 6
    got, meta = await ids_of(client, admin, "?search=no such thing")
    assert (got, meta) == ([], {"page": 1, "perPage": 10, "total": 0, "totalPages": 0})
    for bad in (
        "page[size]=0",
        "page[size]=1001",
        "page[size]=x",
        "page[size]=-1",
        "page[number]=0",
        "page[number]=1.5",
        "page[number]=-2",
        "page[offset]=3",
    ):
        r = await client.get(f"/templates?{bad}", headers=admin.headers)
        assert r.status_code == 400, bad
        assert r.json()["errors"][0]["code"] == 400


async def test_combined_filters(client: httpx.AsyncClient, admin: Account, catalogue: Catalogue) -> None:
    c = catalogue
    got, meta = await ids_of(client, admin, "?filter[status]=1&tags=erp&search=E&sort=-name")
    assert got == [c.ids["Zeta"], c.ids["Order sync"], c.ids["100% done"]]
    assert meta["total"] == 3
    got, meta = await ids_of(
        client, admin, "?filter[status]=0&tags=crm&sort=name&page[size]=1&page[number]=2"
    )
    assert got == [c.ids["under_score"]]
    assert meta == {"page": 2, "perPage": 1, "total": 2, "totalPages": 2}
    # Created without owners, the catalogue is its creator's (SPEC §4).
    got, meta = await ids_of(client, admin, f"?filter[user]={admin.id}&filter[status]=1")
    assert (got, meta["total"]) == (by_id(c, "Order sync", "100% done", "Zeta"), 3)
    got, meta = await ids_of(client, admin, f"?filter[user]={MISSING}&filter[status]=1")
    assert (got, meta["total"]) == ([], 0)


async def test_unknown_and_repeated_filters(client: httpx.AsyncClient, admin: Account) -> None:
    for query in (
        "?filter[type]=ordinary",
        "?filter[tenant]=x",
        "?filter[statuss]=1",
        "?filter[status]=1&filter[status]=0",
    ):
        r = await client.get(f"/templates{query}", headers=admin.headers)
        assert r.status_code == 400, query
    r = await client.get("/templates?filter[foo]=1&filter[bar]=2&sort=x", headers=admin.headers)
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {"filter[foo]", "filter[bar]", "sort"}


# -- flows from templates --------------------------------------------------------------


async def test_create_flow_from_template(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    t = await create(
        client,
        admin,
        "Order sync",
        description="template text",
        cron="0 * * * *",
        owners=[{"id": tenant, "type": "tenant"}],
        tags=["erp"],
        status="published",
    )
    r = await client.post(
        f"/templates/{t['id']}/flows",
        json={"name": "My orders", "description": None, "fields": {"out": {"message": "hi"}}},
        headers=member.headers,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["meta"] == {}
    flow = body["data"]
    assert flow["name"] == "My orders"
    assert flow["description"] is None
    assert flow["cron"] == "0 * * * *"
    assert flow["status"] == "inactive"
    assert flow["fromTemplate"] == t["id"]
    assert flow["tenant"] == tenant
    assert flow["type"] == t["type"]
    assert {"id": member.id, "type": "user"} in flow["owners"]
    assert {"id": tenant, "type": "tenant"} in flow["owners"]
    nodes = {n["id"]: n for n in flow["graph"]["nodes"]}
    assert nodes["out"]["fields"] == {"level": "info", "message": "hi"}
    assert nodes["in"] == t["graph"]["nodes"][0]
    assert flow["graph"]["edges"] == t["graph"]["edges"]
    r = await client.get(f"/flows/{flow['id']}", headers=member.headers)
    assert r.status_code == 200 and r.json()["data"] == flow
    # The template itself is untouched.
    assert (await client.get(f"/templates/{t['id']}", headers=member.headers)).json()["data"] == t

    # No body: a copy of the template, with cron cleared on request.
    r = await client.post(f"/templates/{t['id']}/flows", headers=member.headers)
    assert r.status_code == 201, r.text
    copy = r.json()["data"]
    assert (copy["name"], copy["description"], copy["cron"]) == ("Order sync", "template text", "0 * * * *")
    r = await client.post(f"/templates/{t['id']}/flows", json={"cron": None}, headers=member.headers)
    assert r.status_code == 201 and r.json()["data"]["cron"] is None


async def test_create_flow_from_template_errors(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    a = await factory.tenant()
    b = await factory.tenant()
    member = await factory.user(tenant=a)
    other = await factory.user(tenant=b)
    no_create = await factory.user(tenant=a, permissions=["flowTemplates.read"])
    no_read = await factory.user(tenant=a, permissions=["tenant.flows.create"])
    t = await create(client, admin, owners=[{"id": a, "type": "tenant"}])
    url = f"/templates/{t['id']}/flows"

    assert (await client.post(url, json={}, headers=no_create.headers)).status_code == 403
    assert (await client.post(url, json={}, headers=no_read.headers)).status_code == 403
    assert (await client.post(url, json={}, headers=other.headers)).status_code == 404

    r = await client.post(
        url,
        json={"fields": {"ghost": {}, "out": "x"}, "tenant": "t", "cron": "every minute", "name": ""},
        headers=member.headers,
    )
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {"fields.ghost", "fields.out", "tenant"}
    r = await client.post(url, json={"cron": "every minute", "name": ""}, headers=member.headers)
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {"cron", "name"}
    r = await client.post(url, json={"fields": {"out": {"level": "shout"}}}, headers=member.headers)
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"].startswith("graph.nodes[1].fields")
    assert (await client.post(url, json=[], headers=member.headers)).status_code == 400
    r = await client.post(url, content=b"x", headers={**member.headers, "Content-Type": "text/plain"})
    assert r.status_code == 415
    r = await client.get("/flows", headers=member.headers)
    assert r.json()["meta"]["total"] == 0


# -- import (the CLI's service) ------------------------------------------------------------


async def test_import_is_all_or_nothing_and_idempotent(
    client: httpx.AsyncClient, admin: Account, db: Database, registry: Registry
) -> None:
    good = tpl("imported", tags=["x"], status="published")
    with pytest.raises(InvalidInput) as exc:
        async with db.write() as session:
            await template_service.import_templates(session, [good, {"name": "broken"}, good], registry)
    fields = {p.field for p in exc.value.problems}
    assert fields == {"[1].type", "[1].graph"}
    assert (await ids_of(client, admin))[0] == []

    async with db.write() as session:
        (single,) = await template_service.import_templates(session, good, registry)
    t = (await client.get(f"/templates/{single}", headers=admin.headers)).json()["data"]
    assert (t["name"], t["tags"], t["status"]) == ("imported", ["x"], "published")

    fixed = "66aa00000000000000000001"
    item = {**tpl("with id", tags=["a"]), "id": fixed}
    for name in ("with id", "renamed"):
        async with db.write() as session:
            assert await template_service.import_templates(session, [{**item, "name": name}], registry) == [
                fixed
            ]
    got, meta = await ids_of(client, admin, "?tags=a")
    assert (got, meta["total"]) == ([fixed], 1)  # imported twice, stored once; the "x" one is excluded
    t = (await client.get(f"/templates/{fixed}", headers=admin.headers)).json()["data"]
    assert t["name"] == "renamed"

    with pytest.raises(InvalidInput) as exc:
        async with db.write() as session:
            await template_service.import_templates(session, [item, item, {**item, "id": "nope"}], registry)
    assert {p.field for p in exc.value.problems} == {"[1].id", "[2].id"}
