from __future__ import annotations

import httpx

from tests.conftest import Account, flow_body, wait_until


async def test_webhook_runs_flow(engine_client: httpx.AsyncClient, admin: Account) -> None:
    c = engine_client
    flow = (await c.post("/flows", json=flow_body(), headers=admin.headers)).json()["data"]
    assert (await c.post(f"/flows/{flow['id']}/start", headers=admin.headers)).status_code == 200

    async def active() -> bool:
        return (await c.get(f"/flows/{flow['id']}", headers=admin.headers)).json()["data"][
            "status"
        ] == "active"

    await wait_until(active)
    r = await c.post(f"/webhooks/{flow['id']}", json={"order": 1})
    assert r.status_code == 202, r.text
    eid = r.json()["data"]["executionId"]

    async def done() -> dict | None:
        e = (await c.get(f"/executions/{eid}", headers=admin.headers)).json()["data"]
        return e if e["status"] in ("succeeded", "failed") else None

    e = await wait_until(done)
    assert e["status"] == "succeeded", e
    assert [s["nodeId"] for s in e["steps"]] == ["in", "out"]
