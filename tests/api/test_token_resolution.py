"""Bearer tokens resolved straight from the driver (iam/tokens.py ``authenticate``, db/fast.py)
and kept in the per-process cache (iam/cache.py), written as the attacks, on SQLite and
PostgreSQL: the cache here keeps entries a minute, so anything it wrongly kept would show."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from argon2 import PasswordHasher

from flowyard.clock import utcnow
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.iam import passwords
from flowyard.iam.models import Role, UserRole
from tests.api.test_iam import bearer
from tests.conftest import Factory, flow_body


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@pytest.fixture
def settings(tmp_path: Path, db_url: str) -> Settings:
    return Settings(data_dir=tmp_path, database_url=db_url, session_ttl_seconds=3600, auth_cache_seconds=60)


async def test_an_expiring_token_is_refused_once_expired_though_cached(
    client: httpx.AsyncClient, factory: Factory
) -> None:
    user = await factory.user()
    expires = utcnow() + timedelta(seconds=2)
    r = await client.post("/tokens", json={"expiresAt": expires.isoformat()}, headers=user.headers)
    assert r.status_code == 201, r.text
    token = bearer(r.json()["data"]["token"])
    assert (await client.get("/flows", headers=token)).status_code == 200  # resolved and cached
    await asyncio.sleep((expires - utcnow()).total_seconds() + 0.05)  # past the expiry, not the cache
    r = await client.get("/flows", headers=token)
    assert r.status_code == 401
    assert r.json()["errors"][0]["message"] == "Token expired."


async def test_a_revoked_token_is_refused_at_once_though_cached(
    client: httpx.AsyncClient, factory: Factory
) -> None:
    user = await factory.user()
    r = await client.post("/tokens", json={}, headers=user.headers)
    created = r.json()["data"]
    token = bearer(created["token"])
    assert (await client.get("/flows", headers=token)).status_code == 200
    assert (await client.delete(f"/tokens/{created['id']}", headers=user.headers)).status_code == 200
    assert (await client.get("/flows", headers=token)).status_code == 401


async def test_a_narrowed_token_stays_narrowed_when_resolved_and_cached(
    client: httpx.AsyncClient, factory: Factory, db: Database
) -> None:
    tenant = await factory.tenant()
    user = await factory.user(tenant=tenant, permissions=["tenant.flows.read", "iam.token.create"])
    # A role adds tenant.flows.create: the one statement reads the user's roles too.
    async with db.write() as session:
        role = Role(name="creators", permissions=["tenant.flows.create"], is_global=True)
        session.add(role)
        await session.flush()
        session.add(UserRole(user_id=user.id, role_id=role.id))
    assert (await client.post("/flows", json=flow_body(), headers=user.headers)).status_code == 201
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=user.headers)
    assert r.status_code == 201, r.text
    narrow = bearer(r.json()["data"]["token"])
    for _ in range(2):  # the first resolves, the second comes from the cache
        assert (await client.get("/flows", headers=narrow)).status_code == 200
        r = await client.post("/flows", json=flow_body(), headers=narrow)
        assert r.status_code == 403, r.text
        assert (await client.post("/tokens", json={}, headers=narrow)).status_code == 403


async def test_flow_reads_keep_tenants_apart(client: httpx.AsyncClient, factory: Factory) -> None:
    a, b = await factory.tenant(), await factory.tenant()
    owner = await factory.user(tenant=a)
    outsider = await factory.user(tenant=b)
    tenantless = await factory.user()
    r = await client.post("/flows", json=flow_body(), headers=owner.headers)
    flow_id = r.json()["data"]["id"]
    assert (await client.get(f"/flows/{flow_id}", headers=owner.headers)).json()["data"]["id"] == flow_id
    for other in (outsider, tenantless):
        r = await client.get(f"/flows/{flow_id}", headers=other.headers)
        assert r.status_code == 404
        assert flow_id in r.json()["errors"][0]["message"]  # the same answer as for no such flow
    r = await client.get("/flows/ffffffffffffffffffffffff", headers=outsider.headers)
    assert r.status_code == 404
    r = await client.get("/flows/not-an-id", headers=outsider.headers)
    assert r.status_code == 400
