"""Export and import of flows (SPEC §12) on SQLite and PostgreSQL: a round trip between two
tenants, credentials by name, secrets never exported, and hostile documents refused with every
problem listed and nothing stored."""

from __future__ import annotations

import json
from typing import Any

import httpx

from flowyard.iam import permissions as perms
from tests.conftest import Account, Factory, flow_body

MEMBER = [
    perms.FLOWS_READ,
    perms.FLOWS_CREATE,
    perms.FLOWS_UPDATE,
    perms.FLOWS_DELETE,
    "iam.secret.create",
    "iam.token.create",
]
WEBHOOK_SECRET = "whsec-very-secret-0123456789"


async def _secret(c: httpx.AsyncClient, who: Account, name: str, value: str) -> str:
    r = await c.post("/secrets", json={"name": name, "value": {"token": value}}, headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


def _with_credentials(cid: str) -> dict[str, Any]:
    body = flow_body("Order sync", cron="*/10 * * * *", webhookSecret=WEBHOOK_SECRET)
    body["graph"]["nodes"][1]["credentials_id"] = cid
    return body


async def _count(c: httpx.AsyncClient, who: Account) -> int:
    r = await c.get("/flows", headers=who.headers)
    assert r.status_code == 200, r.text
    return int(r.json()["meta"]["total"])


async def test_round_trip_names_credentials_and_exports_no_secret(
    client: httpx.AsyncClient, factory: Factory
) -> None:
    alice = await factory.user(tenant=await factory.tenant(), permissions=MEMBER)
    bob = await factory.user(tenant=await factory.tenant(), permissions=MEMBER)
    cid = await _secret(client, alice, "erp", "alice-token-value-123")
    r = await client.post("/flows", json=_with_credentials(cid), headers=alice.headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]

    r = await client.get(f"/flows/{fid}/export", headers=alice.headers)
    assert r.status_code == 200, r.text
    doc = r.json()["data"]
    assert set(doc) == {"flowyard", "name", "description", "type", "cron", "graph"}
    assert doc["cron"] == "*/10 * * * *" and doc["name"] == "Order sync"
    assert doc["graph"]["nodes"][1]["credentials_name"] == "erp"
    for leaked in (cid, fid, alice.id, WEBHOOK_SECRET, "alice-token-value-123", "credentials_id"):
        assert leaked not in r.text

    # Bob (another tenant) lacks a secret named "erp": refused, named, nothing stored.
    before = await _count(client, bob)
    r = await client.post("/flows/import", json=doc, headers=bob.headers)
    assert r.status_code == 400, r.text
    assert any("'erp'" in e["message"] and "missing" in e["message"] for e in r.json()["errors"])
    assert await _count(client, bob) == before

    bob_cid = await _secret(client, bob, "erp", "bob-token-value-456")
    r = await client.post("/flows/import", json=doc, headers=bob.headers)
    assert r.status_code == 201, r.text
    made = r.json()["data"]
    assert made["id"] != fid and made["status"] == "inactive" and made["version"] == 1
    assert made["graph"]["nodes"][1]["credentials_id"] == bob_cid
    assert made["cron"] == "*/10 * * * *" and made["webhookSigned"] is False
    assert {"id": bob.id, "type": "user"} in made["owners"] and bob.tenant
    assert {o["id"] for o in made["owners"]} == {bob.id, bob.tenant}
    again = (await client.get(f"/flows/{made['id']}/export", headers=bob.headers)).json()["data"]
    assert again == doc

    # Export of another tenant's flow: not found. Anonymous: 401.
    assert (await client.get(f"/flows/{fid}/export", headers=bob.headers)).status_code == 404
    r = await client.get(f"/flows/{fid}/export")
    assert r.status_code == 401 and "erp" not in r.text
    assert (await client.post("/flows/import", json=doc)).status_code == 401


async def test_permissions_of_export_and_import(client: httpx.AsyncClient, factory: Factory) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant, permissions=MEMBER)
    fid = (await client.post("/flows", json=flow_body(), headers=member.headers)).json()["data"]["id"]
    doc = (await client.get(f"/flows/{fid}/export", headers=member.headers)).json()["data"]
    r = await client.post(
        "/tokens", json={"description": "r", "permissions": [perms.FLOWS_READ]}, headers=member.headers
    )
    reader = {"Authorization": f"Bearer {r.json()['data']['token']}"}
    assert (await client.get(f"/flows/{fid}/export", headers=reader)).status_code == 200
    before = await _count(client, member)
    assert (await client.post("/flows/import", json=doc, headers=reader)).status_code == 403
    tenantless = await factory.user(permissions=MEMBER)
    assert (await client.get(f"/flows/{fid}/export", headers=tenantless.headers)).status_code == 404
    r = await client.post("/flows/import", content=json.dumps(doc), headers=member.headers)
    assert r.status_code == 415
    assert await _count(client, member) == before
    r = await client.post("/flows/import", json=doc, headers=tenantless.headers)
    assert r.status_code == 201, r.text
    assert r.json()["data"]["owners"] == [{"id": tenantless.id, "type": "user"}]


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = {"a": value}
    return value


async def test_hostile_documents_are_refused_with_every_problem(
    client: httpx.AsyncClient, admin: Account
) -> None:
    good = {"flowyard": 1, **{k: v for k, v in flow_body().items()}}
    before = await _count(client, admin)

    async def refused(doc: Any, *expected: str) -> list[str]:
        r = await client.post(
            "/flows/import",
            content=doc if isinstance(doc, bytes) else json.dumps(doc),
            headers={**admin.headers, "Content-Type": "application/json"},
        )
        assert r.status_code == 400, r.text
        messages = [e["message"] for e in r.json()["errors"]]
        for text in expected:
            assert any(text in m for m in messages), (text, messages)
        assert WEBHOOK_SECRET not in r.text and "s3cr3t-inline-value" not in r.text
        return messages

    # Several problems at once, all listed.
    many = json.loads(json.dumps(good))
    many["webhookSecret"] = WEBHOOK_SECRET
    many["owners"] = [{"id": "x", "type": "user"}]
    many["graph"]["nodes"][1]["componentId"] = "no-such-component"
    many["graph"]["nodes"][0]["credentials"] = {"password": "s3cr3t-inline-value"}
    many["graph"]["nodes"][0]["credentials_name"] = "nobody-has-this"
    messages = await refused(
        many, "webhookSecret", "owners", "no-such-component", "credentials", "nobody-has-this"
    )
    assert len(messages) >= 5
    # Huge, deeply nested, not JSON, not an object, a credential by id, an unknown format.
    await refused(json.dumps({**good, "description": "x" * 600_000}).encode(), "bytes")
    await refused({**good, "graph": {"nodes": [{"id": "in", "fields": _deep(100)}], "edges": []}}, "deeper")
    await refused(b"[" * 5000, "")
    await refused(b"{not json", "not valid JSON")
    await refused([good], "JSON object")
    by_id = json.loads(json.dumps(good))
    by_id["graph"]["nodes"][1]["credentials_id"] = "0123456789abcdef01234567"
    await refused(by_id, "credentials_id")
    await refused({**good, "flowyard": 99}, "format")
    await refused({**good, "id": "0123456789abcdef01234567", "tenant": "t"}, "id", "tenant")
    assert await _count(client, admin) == before
    # The same document without the hostile parts is accepted.
    r = await client.post("/flows/import", json=good, headers=admin.headers)
    assert r.status_code == 201, r.text
    assert await _count(client, admin) == before + 1
