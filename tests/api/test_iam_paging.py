"""Every IAM list and the secrets list is paged as SPEC §1 says. SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Account, Factory

PAGED = ("/tokens", "/roles", "/tenants", "/secrets")


async def fill(client: httpx.AsyncClient, admin: Account, factory: Factory, n: int) -> dict[str, list[str]]:
    """``n`` objects in each list the admin sees; their ids in id order."""
    ids: dict[str, list[str]] = {p: [] for p in PAGED}
    ids["/tokens"].append((await client.get("/tokens", headers=admin.headers)).json()["data"][0]["id"])
    for i in range(n - 1):
        r = await client.post("/tokens", json={"description": f"t{i}"}, headers=admin.headers)
        ids["/tokens"].append(r.json()["data"]["id"])
    for i in range(n):
        tenant = await factory.tenant(f"paged-{i}")
        ids["/tenants"].append(tenant)
        r = await client.post("/roles", json={"name": f"r{i}", "permissions": []}, headers=admin.headers)
        ids["/roles"].append(r.json()["data"]["id"])
        r = await client.post(
            "/secrets", json={"name": f"s{i}", "value": {"token": "x"}}, headers=admin.headers
        )
        ids["/secrets"].append(r.json()["data"]["id"])
    return {k: sorted(v) for k, v in ids.items()}


async def test_lists_are_paged(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    ids = await fill(client, admin, factory, 12)
    for path in PAGED:
        r = await client.get(path, headers=admin.headers)
        assert r.status_code == 200, (path, r.text)
        body = r.json()
        assert [x["id"] for x in body["data"]] == ids[path][:10], path
        assert body["meta"] == {"page": 1, "perPage": 10, "total": 12, "totalPages": 2}, path
        r = await client.get(f"{path}?page[size]=5&page[number]=3", headers=admin.headers)
        body = r.json()
        assert [x["id"] for x in body["data"]] == ids[path][10:], path
        assert body["meta"] == {"page": 3, "perPage": 5, "total": 12, "totalPages": 3}, path
        r = await client.get(f"{path}?page[number]=9", headers=admin.headers)
        assert (r.json()["data"], r.json()["meta"]["total"]) == ([], 12)
        for bad in ("page[size]=0", "page[size]=1001", "page[number]=0", "page[size]=x", "page[bogus]=1"):
            r = await client.get(f"{path}?{bad}", headers=admin.headers)
            assert r.status_code == 400, (path, bad)
            assert r.json()["errors"][0]["code"] == 400


async def test_the_bare_user_array_is_bounded(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    users = sorted([admin.id] + [(await factory.user()).id for _ in range(11)])
    r = await client.get("/api/users", headers=admin.headers)
    assert [u["id"] for u in r.json()] == users[:10]
    r = await client.get("/users?page[size]=5&page[number]=3", headers=admin.headers)
    assert [u["id"] for u in r.json()] == users[10:]
    r = await client.get("/api/users?page[size]=1000", headers=admin.headers)
    assert [u["id"] for u in r.json()] == users
    r = await client.get("/api/users?meta=true&page[size]=5", headers=admin.headers)
    assert r.json()["meta"] == {"page": 1, "perPage": 5, "total": 12, "totalPages": 3}
    for bad in ("page[size]=1001", "page[number]=-1"):
        assert (await client.get(f"/api/users?{bad}", headers=admin.headers)).status_code == 400


async def test_paging_never_widens_visibility(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    a = await factory.tenant()
    b = await factory.tenant()
    lead = await factory.user(tenant=a, permissions=["tenant.all", "iam.secret.read", "iam.secret.create"])
    for scope in (a, b):
        r = await client.post(
            "/roles", json={"name": "x", "permissions": [], "scope": scope}, headers=admin.headers
        )
        assert r.status_code == 201
        r = await client.post(
            "/secrets", json={"name": "s", "value": {"token": "t"}, "tenant": scope}, headers=admin.headers
        )
        assert r.status_code == 201
    for path in ("/roles", "/secrets", "/tenants"):
        r = await client.get(f"{path}?page[size]=1000", headers=lead.headers)
        assert r.json()["meta"]["total"] == 1, path
    r = await client.get("/tokens?page[size]=1000", headers=lead.headers)
    assert {t["user"] for t in r.json()["data"]} == {lead.id}


@pytest.mark.parametrize("path", ["/api/users", "/tokens", "/roles", "/tenants", "/secrets"])
async def test_openapi_documents_the_paging(client: httpx.AsyncClient, path: str) -> None:
    doc = (await client.get("/openapi.json")).json()
    op = doc["paths"][path]["get"]
    names = {p["name"] for p in op.get("parameters", [])}
    assert {"page[size]", "page[number]"} <= names
    assert "400" in op["responses"]
    if path != "/api/users":
        schema = op["responses"]["200"]["content"]["application/json"]["schema"]
        ref = schema["$ref"].rsplit("/", 1)[1]
        assert "meta" in doc["components"]["schemas"][ref]["properties"]
