"""Rules that hold on every path (api/paths.py, api/deps.read_json), on SQLite and PostgreSQL:
NUL refused with 400 in the path, the query and every stored text field of a JSON body;
``Allow`` on a 405 naming every method of the path; one trailing slash ignored, no redirect."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.api.test_flows import assert_error, cheap_password_hashing  # noqa: F401
from tests.conftest import Account, Factory, flow_body, wait_until

JSON = {"Content-Type": "application/json"}


def _headers(account: Account) -> dict[str, str]:
    return {**account.headers, **JSON}


async def _post(client: httpx.AsyncClient, account: Account, path: str, body: Any) -> httpx.Response:
    return await client.post(path, content=orjson.dumps(body), headers=_headers(account))


# ---------------------------------------------------------------------------- NUL


@pytest.mark.parametrize(
    "url",
    ["/flows/%00", "/flows?search=a%00b", "/flows?filter%5Bname%00%5D=x", "/api/users/%00abc", "/logs?x=%00"],
)
async def test_nul_in_path_or_query(client: httpx.AsyncClient, admin: Account, url: str) -> None:
    r = await client.get(url, headers=admin.headers)
    assert_error(r, 400)
    assert "NUL" in r.json()["errors"][0]["message"]


async def test_nul_refused_anonymous_too(client: httpx.AsyncClient) -> None:
    """Before authentication: the rule does not depend on who asks, and says nothing else."""
    r = await client.get("/flows?search=%00")
    assert_error(r, 400)


IAM_BODIES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/tenants", {"name": "t\x00"}),
    ("POST", "/roles", {"name": "r\x00", "permissions": []}),
    ("POST", "/roles", {"name": "r", "description": "d\x00"}),
    ("POST", "/secrets", {"name": "s", "value": {"password\x00": "x"}}),
    ("POST", "/secrets", {"name": "s", "value": {"password": "x\x00y"}}),
    ("POST", "/tokens", {"description": "tok\x00"}),
    ("POST", "/tokens/introspect", {"token": "abc\x00"}),
    ("POST", "/login", {"username": "a\x00@example.com", "password": "correct horse battery"}),
    ("POST", "/api/users", {"username": "n\x00@example.com", "password": "correct horse battery"}),
    ("POST", "/api/users", {"username": "n@example.com", "password": "correct horse\x00 battery"}),
    (
        "POST",
        "/api/users",
        {"username": "n@example.com", "password": "correct horse battery", "firstname": "\x00"},
    ),
    ("POST", "/templates", {**flow_body("tpl\x00")}),
]


@pytest.mark.parametrize(
    ("method", "path", "body"), IAM_BODIES, ids=[f"{m} {p} {i}" for i, (m, p, _) in enumerate(IAM_BODIES)]
)
async def test_nul_in_json_bodies(
    client: httpx.AsyncClient, admin: Account, method: str, path: str, body: dict[str, Any]
) -> None:
    r = await client.request(method, path, content=orjson.dumps(body), headers=_headers(admin))
    assert_error(r, 400)
    assert any("NUL" in e["message"] for e in r.json()["errors"]), r.text
    # Nothing with a NUL was stored (the listing would answer 500 on PostgreSQL otherwise).
    listed = await client.get(
        path if path not in ("/tokens/introspect", "/login") else "/tokens", headers=admin.headers
    )
    assert listed.status_code == 200
    assert "\\u0000" not in listed.text


async def test_nul_in_patch_bodies(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    user = await factory.user()
    r = await client.patch(
        f"/api/users/{user.id}", content=orjson.dumps({"lastname": "x\x00"}), headers=_headers(admin)
    )
    assert_error(r, 400)
    role = await _post(client, admin, "/roles", {"name": "plain", "permissions": []})
    assert role.status_code == 201, role.text
    rid = role.json()["data"]["id"] if "data" in role.json() else role.json()["id"]
    r = await client.patch(f"/roles/{rid}", content=orjson.dumps({"name": "a\x00"}), headers=_headers(admin))
    assert_error(r, 400)
    shown = await client.get(f"/roles/{rid}", headers=admin.headers)
    assert "\\u0000" not in shown.text


async def test_nul_inside_run_data_is_data(engine_client: httpx.AsyncClient, admin: Account) -> None:
    """A manual run's or a webhook's body is the execution's input, kept as a JSON document
    (``json`` on PostgreSQL, text on SQLite): NUL inside its strings is data on both databases,
    stored escaped, and the execution runs to its end."""
    c = engine_client
    created = await _post(c, admin, "/flows", flow_body("runs"))
    assert created.status_code == 201, created.text
    fid = created.json()["data"]["id"]
    assert (await c.post(f"/flows/{fid}/start", headers=admin.headers)).status_code == 200

    async def active() -> bool:
        r = await c.get(f"/flows/{fid}", headers=admin.headers)
        return bool(r.json()["data"]["status"] == "active")

    await wait_until(active, within=60)
    manual = await _post(c, admin, f"/flows/{fid}/executions", {"text": "a\x00b", "k\x00": 1})
    assert manual.status_code == 202, manual.text
    hook = await c.post(f"/webhooks/{fid}", content=orjson.dumps({"text": "c\x00d"}), headers=JSON)
    assert hook.status_code == 202, hook.text
    eid = manual.json()["data"]["executionId"]

    async def finished() -> bool:
        r = await c.get(f"/executions/{eid}", headers=admin.headers)
        assert r.status_code == 200, r.text
        return bool(r.json()["data"]["status"] == "succeeded")

    await wait_until(finished, within=60)
    listed = await c.get("/executions", params={"filter[flowId]": fid}, headers=admin.headers)
    assert listed.status_code == 200, listed.text
    assert len(listed.json()["data"]) == 2


# ---------------------------------------------------------------------------- Allow


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/api/users", {"GET", "POST"}),
        # /tokens/{id} matches it too, but a literal path is its own resource.
        ("PUT", "/tokens/introspect", {"POST"}),
        ("DELETE", "/tokens/introspect", {"POST"}),
        ("PUT", "/flows", {"GET", "POST"}),
        ("PUT", "/flows/5f0000000000000000000000", {"GET", "PATCH", "DELETE"}),
        ("PUT", "/roles/5f0000000000000000000000", {"GET", "PATCH", "DELETE"}),
        ("DELETE", "/templates", {"GET", "POST"}),
        ("GET", "/flows/5f0000000000000000000000/start", {"POST"}),
        ("PUT", "/tokens", {"GET", "POST"}),
    ],
)
async def test_allow_names_every_method(
    client: httpx.AsyncClient, admin: Account, method: str, path: str, allowed: set[str]
) -> None:
    r = await client.request(method, path, headers=admin.headers)
    assert_error(r, 405)
    assert {m.strip() for m in r.headers["allow"].split(",")} == allowed


async def test_allow_for_anonymous_callers(client: httpx.AsyncClient) -> None:
    r = await client.put("/api/users")
    assert r.status_code == 405
    assert {m.strip() for m in r.headers["allow"].split(",")} == {"GET", "POST"}


# ---------------------------------------------------------------------------- trailing slash


@pytest.mark.parametrize(
    "path", ["/flows", "/templates", "/api/users", "/users", "/roles", "/secrets", "/tokens"]
)
async def test_trailing_slash_answers_the_same(client: httpx.AsyncClient, admin: Account, path: str) -> None:
    created = await _post(client, admin, "/flows", flow_body("listed"))
    assert created.status_code == 201
    plain = await client.get(path, headers=admin.headers)
    slashed = await client.get(path + "/", headers=admin.headers)
    assert plain.status_code == 200, plain.text
    assert slashed.status_code == 200, slashed.text
    assert slashed.json() == plain.json()


async def test_trailing_slash_on_create_and_item(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post("/flows/", content=orjson.dumps(flow_body("slash")), headers=_headers(admin))
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    item = await client.get(f"/flows/{fid}/", headers=admin.headers)
    assert item.status_code == 200
    assert item.json()["data"]["name"] == "slash"


async def test_trailing_slash_keeps_authorization(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    """Another tenant's member sees through /flows/ exactly what /flows shows them: nothing of
    the admin's; an anonymous caller gets 401, not a redirect."""
    fid = (await _post(client, admin, "/flows", flow_body("private"))).json()["data"]["id"]
    other = await factory.user(tenant=await factory.tenant())
    listed = await client.get("/flows/", headers=other.headers)
    assert listed.status_code == 200
    assert fid not in listed.text
    assert (await client.get(f"/flows/{fid}/", headers=other.headers)).status_code == 404
    assert_error(await client.get("/flows/"), 401)


async def test_unknown_slashed_path_is_404_not_redirect(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.get("/nowhere/", headers=admin.headers)
    assert_error(r, 404)
    r = await client.get("/flows//", headers=admin.headers)
    assert r.status_code in (400, 404)
