from __future__ import annotations

import httpx

from tests.conftest import Account, flow_body


async def test_create_and_read_flow(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post("/flows", json=flow_body(), headers=admin.headers)
    assert r.status_code == 201, r.text
    flow = r.json()["data"]
    assert flow["status"] == "inactive"
    r = await client.get(f"/flows/{flow['id']}", headers=admin.headers)
    assert r.status_code == 200
    assert r.json() == {"data": flow, "meta": {}}
