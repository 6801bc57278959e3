"""Rotating credentials (issue 21): ``PUT /secrets/{id}`` stores a new value under the same id,
so the nodes naming it keep working with the new value; the value is never answered. Another
tenant's member and a tenantless user get 404 (the same as an unknown id); bad bodies are 400
and change nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from flowyard.db.session import Database
from flowyard.secrets import service as secrets
from tests.api.test_access import cheap_password_hashing
from tests.conftest import Factory

__all__ = ["cheap_password_hashing"]


async def _value(app: FastAPI, db: Database, sid: str, tenant: str) -> object:
    async with db.read() as session:
        found, problems = await secrets.resolve(
            session, app.state.secret_box, [sid], tenant=tenant, owner_user=None
        )
    assert not problems, problems
    return found[sid]


async def test_rotation_keeps_the_id_and_never_answers_the_value(
    app: FastAPI, client: httpx.AsyncClient, factory: Factory, db: Database
) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant, permissions=["iam.secret.create", "iam.secret.read"])
    r = await client.post(
        "/secrets", json={"name": "partner", "value": {"token": "old-9f3a"}}, headers=member.headers
    )
    assert r.status_code == 201, r.text
    created = r.json()["data"]
    sid = created["id"]

    r = await client.put(f"/secrets/{sid}", json={"value": {"token": "new-77c1"}}, headers=member.headers)
    assert r.status_code == 200, r.text
    rotated = r.json()["data"]
    assert (rotated["id"], rotated["name"]) == (sid, "partner")
    assert rotated["updatedAt"] >= created["updatedAt"]
    assert "new-77c1" not in r.text and "old-9f3a" not in r.text and "value" not in rotated
    assert await _value(app, db, sid, tenant) == {"token": "new-77c1"}

    for body in ({"value": [1]}, {"value": "x"}, {"value": {"a": 1}, "name": "renamed"}, {}):
        r = await client.put(f"/secrets/{sid}", json=body, headers=member.headers)
        assert r.status_code == 400, (body, r.text)
    assert await _value(app, db, sid, tenant) == {"token": "new-77c1"}, "a refused rotation changed nothing"

    writer = ["iam.secret.create"]
    stranger = await factory.user(tenant=await factory.tenant(), permissions=writer)
    loner = await factory.user(tenant=None, permissions=writer)
    reader = await factory.user(tenant=tenant, permissions=["iam.secret.read"])
    r = await client.put(f"/secrets/{sid}", json={"value": {"token": "x"}}, headers=reader.headers)
    assert r.status_code == 403, "reading credentials is not changing them"
    for who in (stranger, loner):
        r = await client.put(f"/secrets/{sid}", json={"value": {"token": "stolen"}}, headers=who.headers)
        assert r.status_code == 404, r.text
    r = await client.put(f"/secrets/{'0' * 24}", json={"value": {"token": "x"}}, headers=member.headers)
    assert r.status_code == 404
    assert (await client.put(f"/secrets/{sid}", json={"value": {"token": "x"}})).status_code == 401
    assert await _value(app, db, sid, tenant) == {"token": "new-77c1"}
