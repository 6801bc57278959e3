"""A flow names only secrets its owners may use (issue 22), on SQLite and PostgreSQL: checked
when the flow is saved (create, array create, PATCH of the graph, PATCH of the owners, a flow
made from a template) and again at POST /start, which answers 409 with every reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from flowyard.app import create_app
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.iam import passwords
from tests.conftest import Account, Factory, flow_body

MISSING = "0123456789abcdef01234567"
SECRET_PERMS = ["iam.secret.create", "iam.secret.read"]
MEMBER = [
    "tenant.flows.read",
    "tenant.flows.create",
    "tenant.flows.update",
    "tenant.flows.delete",
    "flowTemplates.read",
    "iam.token.create",
    *SECRET_PERMS,
]
NODE = "graph.nodes[1].credentials_id"
UNUSABLE = "not found, or not usable by this flow's owners"


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@dataclass
class World:
    alice: Account  # tenant A
    bob: Account  # tenant B
    loner: Account  # no tenant
    other_loner: Account  # no tenant either
    secret_a: str  # tenant A's
    secret_b: str  # tenant B's
    secret_loner: str  # the loner's, tenantless
    secret_other: str  # the other loner's, tenantless


async def _secret(client: httpx.AsyncClient, who: Account, name: str) -> str:
    r = await client.post(
        "/secrets", json={"name": name, "value": {"token": "t-" + name}}, headers=who.headers
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


@pytest.fixture
async def world(client: httpx.AsyncClient, factory: Factory) -> World:
    a, b = await factory.tenant("A"), await factory.tenant("B")
    alice = await factory.user(tenant=a, permissions=MEMBER)
    bob = await factory.user(tenant=b, permissions=MEMBER)
    loner = await factory.user(permissions=MEMBER)
    other = await factory.user(permissions=MEMBER)
    return World(
        alice,
        bob,
        loner,
        other,
        await _secret(client, alice, "a"),
        await _secret(client, bob, "b"),
        await _secret(client, loner, "l"),
        await _secret(client, other, "o"),
    )


def with_credentials(credentials_id: str, name: str = "uses a secret", **extra: Any) -> dict[str, Any]:
    body = flow_body(name, **extra)
    body["graph"]["nodes"][1]["credentials_id"] = credentials_id
    return body


def assert_unusable(r: httpx.Response, credentials_id: str, field: str = NODE) -> None:
    assert r.status_code == 400, r.text
    errors = r.json()["errors"]
    assert [e["field"] for e in errors] == [field], errors
    assert "node 'out'" in errors[0]["message"] and credentials_id in errors[0]["message"]
    assert UNUSABLE in errors[0]["message"] and errors[0]["code"] == 400


async def test_create_refuses_unknown_and_foreign_secrets_alike(
    client: httpx.AsyncClient, world: World
) -> None:
    w = world
    for who, cid in (
        (w.alice, MISSING),
        (w.alice, w.secret_b),
        (w.alice, w.secret_loner),
        (w.loner, w.secret_a),
    ):
        r = await client.post("/flows", json=with_credentials(cid), headers=who.headers)
        assert_unusable(r, cid)
    # A tenantless user may use its own tenantless secrets, not another tenantless user's.
    r = await client.post("/flows", json=with_credentials(w.secret_other), headers=w.loner.headers)
    assert_unusable(r, w.secret_other)
    # A malformed id reads as unknown too.
    r = await client.post("/flows", json=with_credentials("not-an-id"), headers=w.alice.headers)
    assert_unusable(r, "not-an-id")
    for who, cid in ((w.alice, w.secret_a), (w.loner, w.secret_loner)):
        r = await client.post("/flows", json=with_credentials(cid), headers=who.headers)
        assert r.status_code == 201, r.text
    listed = (await client.get("/flows", headers=w.alice.headers)).json()["data"]
    assert [f["graph"]["nodes"][1]["credentials_id"] for f in listed] == [w.secret_a]


async def test_array_create_fails_the_bad_item_alone(client: httpx.AsyncClient, world: World) -> None:
    w = world
    body = [with_credentials(w.secret_a, "good"), with_credentials(w.secret_b, "bad"), flow_body("plain")]
    r = await client.post("/flows", json=body, headers=w.alice.headers)
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    assert data[0]["name"] == "good" and data[2]["name"] == "plain"
    assert data[1]["errors"][0]["field"] == NODE and UNUSABLE in data[1]["errors"][0]["message"]
    names = [f["name"] for f in (await client.get("/flows", headers=w.alice.headers)).json()["data"]]
    assert names == ["good", "plain"]


async def test_patch_of_the_graph_is_checked(client: httpx.AsyncClient, world: World) -> None:
    w = world
    flow = (await client.post("/flows", json=flow_body(), headers=w.alice.headers)).json()["data"]
    for cid in (MISSING, w.secret_b):
        r = await client.patch(
            f"/flows/{flow['id']}", json={"graph": with_credentials(cid)["graph"]}, headers=w.alice.headers
        )
        assert_unusable(r, cid)
    stored = (await client.get(f"/flows/{flow['id']}", headers=w.alice.headers)).json()["data"]
    assert stored["graph"] == flow["graph"] and stored["updatedAt"] == flow["updatedAt"]
    r = await client.patch(
        f"/flows/{flow['id']}", json={"graph": with_credentials(w.secret_a)["graph"]}, headers=w.alice.headers
    )
    assert r.status_code == 200, r.text
    # A PATCH of another field keeps checking what is stored: still usable, so accepted.
    r = await client.patch(f"/flows/{flow['id']}", json={"name": "renamed"}, headers=w.alice.headers)
    assert r.status_code == 200, r.text


async def test_patch_of_owners_that_strands_the_credentials_is_refused(
    client: httpx.AsyncClient, world: World, admin: Account
) -> None:
    w = world
    r = await client.post("/flows", json=with_credentials(w.secret_loner), headers=w.loner.headers)
    assert r.status_code == 201, r.text
    flow = r.json()["data"]
    assert flow["owners"] == [{"id": w.loner.id, "type": "user"}]
    url = f"/flows/{flow['id']}"
    # The tenantless owner removes itself: nobody would be left to use its secret.
    r = await client.patch(url, json={"owners": []}, headers=w.loner.headers)
    assert r.status_code == 400, r.text
    errors = r.json()["errors"]
    assert [e["field"] for e in errors] == ["owners"]
    assert "would leave the flow's credentials unusable" in errors[0]["message"]
    assert "node 'out'" in errors[0]["message"] and w.secret_loner in errors[0]["message"]
    # An administrator putting another user first (the user a tenantless flow's secrets are
    # read for) is refused the same way; so is moving the flow into a tenant.
    other_first = [{"id": w.other_loner.id, "type": "user"}, {"id": w.loner.id, "type": "user"}]
    tenant_a = w.alice.tenant
    assert tenant_a is not None
    for patch in ({"owners": other_first}, {"tenant": tenant_a}):
        r = await client.patch(url, json=patch, headers=admin.headers)
        assert r.status_code == 400, (patch, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["owners"], patch
    stored = (await client.get(url, headers=w.loner.headers)).json()["data"]
    assert stored["owners"] == flow["owners"] and stored["tenant"] is None
    # Adding an owner after the first user keeps the secret usable: accepted.
    more = [{"id": w.loner.id, "type": "user"}, {"id": w.other_loner.id, "type": "user"}]
    r = await client.patch(url, json={"owners": more}, headers=admin.headers)
    assert r.status_code == 200, r.text
    # Changing owners and graph together to another usable secret is judged on the result.
    r = await client.patch(
        url,
        json={"owners": other_first, "graph": with_credentials(w.secret_other)["graph"]},
        headers=admin.headers,
    )
    assert r.status_code == 200, r.text


async def test_flow_from_template_is_checked(client: httpx.AsyncClient, world: World, admin: Account) -> None:
    w = world
    body = with_credentials(w.secret_a, "templated", shared=True)
    r = await client.post("/templates", json={**body, "owners": []}, headers=admin.headers)
    assert r.status_code == 201, r.text
    url = f"/templates/{r.json()['data']['id']}/flows"
    r = await client.post(url, json={}, headers=w.alice.headers)
    assert r.status_code == 201, r.text
    for who in (w.bob, w.loner):
        r = await client.post(url, json={"name": "mine"}, headers=who.headers)
        assert_unusable(r, w.secret_a)
        assert (await client.get("/flows", headers=who.headers)).json()["meta"]["total"] == 0


@pytest.fixture
async def without_log(
    settings: Settings, db: Database, registry: Registry
) -> AsyncIterator[httpx.AsyncClient]:
    """The same service after the ``log`` component was uninstalled."""
    smaller = Registry({c.id: c for c in registry.all() if c.id != "log"})
    app = create_app(settings, db=db, registry=smaller, run_engine=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://flowyard.test"
    ) as c:
        yield c


async def test_start_answers_409_with_every_reason(
    client: httpx.AsyncClient, world: World, without_log: httpx.AsyncClient
) -> None:
    w = world
    r = await client.post("/flows", json=with_credentials(w.secret_a), headers=w.alice.headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    assert (await client.delete(f"/secrets/{w.secret_a}", headers=w.alice.headers)).status_code == 200
    r = await client.post(f"/flows/{fid}/start", headers=w.alice.headers)
    assert r.status_code == 409, r.text
    errors = r.json()["errors"]
    assert [e["field"] for e in errors] == [NODE]
    assert errors[0]["message"].startswith("Flow cannot start: ") and w.secret_a in errors[0]["message"]
    assert errors[0]["code"] == 409
    # Two reasons at once: the component is gone as well.
    r = await without_log.post(f"/flows/{fid}/start", headers=w.alice.headers)
    assert r.status_code == 409, r.text
    fields = [e["field"] for e in r.json()["errors"]]
    assert fields == ["graph.nodes[1].componentId", NODE]
    flow = (await client.get(f"/flows/{fid}", headers=w.alice.headers)).json()["data"]
    assert flow["status"] == "inactive" and flow["statusMessage"] is None
    # Another tenant's member still gets 404, not the reasons.
    r = await client.post(f"/flows/{fid}/start", headers=w.bob.headers)
    assert r.status_code == 404
    # With a usable secret again the start is accepted.
    secret = await _secret(client, w.alice, "again")
    r = await client.patch(
        f"/flows/{fid}", json={"graph": with_credentials(secret)["graph"]}, headers=w.alice.headers
    )
    assert r.status_code == 200, r.text
    r = await client.post(f"/flows/{fid}/start", headers=w.alice.headers)
    assert (r.status_code, r.json()["data"]["status"]) == (200, "starting")
