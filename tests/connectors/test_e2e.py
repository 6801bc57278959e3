"""A connector inside the running service: stored credentials reach the runner process, the
component comes from its entry point, and GET /components documents it."""

from __future__ import annotations

import uuid

import asyncpg
import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Factory, flow_body
from tests.connectors.conftest import LOOPBACK, require_server
from tests.engine.test_engine_e2e import active_flow

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    return engine_settings.model_copy(update={"http_allow_networks": LOOPBACK})


async def test_webhook_to_postgres_insert_with_a_stored_credential(
    engine_client: httpx.AsyncClient, factory: Factory
) -> None:
    require_server("PostgreSQL", 5432)
    c = engine_client
    table = f"e2e_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_URL)
    await conn.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, qty INTEGER)")
    try:
        member = await factory.user(
            tenant=await factory.tenant(),
            permissions=[
                "tenant.flows.read",
                "tenant.flows.create",
                "tenant.flows.update",
                "iam.secret.create",
            ],
        )
        r = await c.post("/secrets", json={"name": "pg", "value": {"url": PG_URL}}, headers=member.headers)
        assert r.status_code == 201, r.text
        secret = r.json()["data"]["id"]
        graph = {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {
                    "id": "insert",
                    "componentId": "sql",
                    "function": "execute",
                    "credentials_id": secret,
                    "fields": {
                        "statement": f"INSERT INTO {table} (id, qty) VALUES (:id, :qty)",
                        "params": {"id": "order.id", "qty": "order.qty"},
                    },
                },
            ],
            "edges": [{"source": "in", "target": "insert"}],
        }
        fid = await active_flow(c, member, flow_body(graph=graph))
        evil = "A-1'); DROP TABLE " + table + "; --"
        r = await c.post(f"/webhooks/{fid}", params={"wait": 10}, json={"order": {"id": evil, "qty": 3}})
        assert r.status_code == 200, r.text
        assert r.json() == {"rowCount": 1}
        assert await conn.fetch(f"SELECT id, qty FROM {table}") == [(evil, 3)]
        flow = (await c.get(f"/flows/{fid}", headers=member.headers)).text
        assert "postgres@" not in flow
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()


async def test_components_endpoint_documents_the_connectors(
    engine_client: httpx.AsyncClient, factory: Factory
) -> None:
    member = await factory.user(tenant=await factory.tenant(), permissions=["tenant.flows.read"])
    r = await engine_client.get("/components", headers=member.headers)
    assert r.status_code == 200, r.text
    by_id = {c["id"]: c for c in r.json()["data"]}
    for cid in ("sql", "amqp", "mqtt", "redis", "email"):
        assert cid in by_id, sorted(by_id)
    assert "statement" in str(by_id["sql"]) and "routingKey" in str(by_id["amqp"])
