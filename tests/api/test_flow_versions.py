"""Flow versions (SPEC §12) on SQLite and PostgreSQL: a version on every change of graph or
cron and none on a change of name; reading, restoring, executions naming their version; and
who may do what (another tenant's member, a narrowed token, a tenantless user, anonymous)."""

from __future__ import annotations

from typing import Any

import httpx
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from flowyard.iam import permissions as perms
from flowyard.ids import new_id
from flowyard.queue import store as queue
from tests.conftest import Account, Factory, flow_body, wait_until

OTHER_GRAPH = {
    "nodes": [
        {"id": "in", "componentId": "webhook", "function": "receive"},
        {"id": "out", "componentId": "log", "fields": {"level": "warn"}},
    ],
    "edges": [{"source": "in", "target": "out"}],
}


async def _create(c: httpx.AsyncClient, who: Account, **extra: Any) -> dict[str, Any]:
    r = await c.post("/flows", json=flow_body(**extra), headers=who.headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


async def _patch(c: httpx.AsyncClient, who: Account, fid: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.patch(f"/flows/{fid}", json=body, headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


async def _versions(c: httpx.AsyncClient, who: Account, fid: str, query: str = "") -> dict[str, Any]:
    r = await c.get(f"/flows/{fid}/versions{query}", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_history_moves_on_graph_and_cron_not_on_name(client: httpx.AsyncClient, admin: Account) -> None:
    flow = await _create(client, admin)
    fid = flow["id"]
    assert flow["version"] == 1
    assert (await _patch(client, admin, fid, {"name": "Renamed", "description": "x"}))["version"] == 1
    assert (await _patch(client, admin, fid, {"graph": OTHER_GRAPH}))["version"] == 2
    assert (await _patch(client, admin, fid, {"cron": "*/5 * * * *"}))["version"] == 3
    assert (await _patch(client, admin, fid, {"cron": "*/5 * * * *"}))["version"] == 3  # no change
    listed = await _versions(client, admin, fid)
    assert listed["meta"] == {"page": 1, "perPage": 10, "total": 3, "totalPages": 1}
    assert [v["version"] for v in listed["data"]] == [3, 2, 1]
    assert [v["current"] for v in listed["data"]] == [True, False, False]
    assert {v["author"] for v in listed["data"]} == {admin.id}
    assert "graph" not in listed["data"][0]
    paged = await _versions(client, admin, fid, "?page[size]=2&page[number]=2")
    assert [v["version"] for v in paged["data"]] == [1]
    assert paged["meta"]["totalPages"] == 2
    bad = await client.get(f"/flows/{fid}/versions?page[size]=0", headers=admin.headers)
    assert bad.status_code == 400

    one = (await client.get(f"/flows/{fid}/versions/1", headers=admin.headers)).json()["data"]
    assert one["graph"] == flow_body()["graph"] and one["cron"] is None and one["version"] == 1
    two = (await client.get(f"/flows/{fid}/versions/2", headers=admin.headers)).json()["data"]
    assert two["graph"] == OTHER_GRAPH and two["cron"] is None
    three = (await client.get(f"/flows/{fid}/versions/3", headers=admin.headers)).json()["data"]
    assert three["cron"] == "*/5 * * * *" and three["current"] is True
    for n, code in (("4", 404), ("0", 400), ("x", 400), ("-1", 400), ("99999999999", 400)):
        r = await client.get(f"/flows/{fid}/versions/{n}", headers=admin.headers)
        assert r.status_code == code, (n, r.text)
        assert r.json()["errors"][0]["code"] == code


async def test_restore_makes_a_new_version_with_the_old_content(
    client: httpx.AsyncClient, admin: Account
) -> None:
    fid = (await _create(client, admin))["id"]
    await _patch(client, admin, fid, {"graph": OTHER_GRAPH, "cron": "0 * * * *", "name": "Kept"})
    r = await client.post(f"/flows/{fid}/versions/1/restore", headers=admin.headers)
    assert r.status_code == 200, r.text
    restored = r.json()["data"]
    assert restored["version"] == 3
    assert restored["graph"] == flow_body()["graph"] and restored["cron"] is None
    assert restored["name"] == "Kept"  # a version is graph, cron and errorFlowId only
    three = (await client.get(f"/flows/{fid}/versions/3", headers=admin.headers)).json()["data"]
    assert three["restoredFrom"] == 1 and three["graph"] == flow_body()["graph"]
    assert (await client.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]["version"] == 3
    missing = await client.post(f"/flows/{fid}/versions/9/restore", headers=admin.headers)
    assert missing.status_code == 404


async def test_restore_of_a_starting_flow_is_refused(client: httpx.AsyncClient, admin: Account) -> None:
    fid = (await _create(client, admin))["id"]
    await _patch(client, admin, fid, {"graph": OTHER_GRAPH})
    assert (await client.post(f"/flows/{fid}/start", headers=admin.headers)).status_code == 200
    # Starting (no engine in this app): in transit, refused.
    r = await client.post(f"/flows/{fid}/versions/1/restore", headers=admin.headers)
    assert r.status_code == 409, r.text
    assert len((await _versions(client, admin, fid))["data"]) == 2


async def test_who_may_read_and_restore(client: httpx.AsyncClient, factory: Factory) -> None:
    tenant, other = await factory.tenant(), await factory.tenant()
    member = await factory.user(tenant=tenant)
    fid = (await _create(client, member))["id"]
    await _patch(client, member, fid, {"graph": OTHER_GRAPH})
    assert len((await _versions(client, member, fid))["data"]) == 2

    # Another tenant's member and a tenantless user: not found, as if the flow did not exist.
    for stranger in (await factory.user(tenant=other), await factory.user()):
        for method, path in (
            ("GET", f"/flows/{fid}/versions"),
            ("GET", f"/flows/{fid}/versions/1"),
            ("POST", f"/flows/{fid}/versions/1/restore"),
        ):
            r = await client.request(method, path, headers=stranger.headers)
            assert r.status_code == 404, (path, r.text)

    # A token narrowed to reading flows lists and reads, but cannot restore.
    r = await client.post(
        "/tokens",
        json={"description": "reader", "permissions": [perms.FLOWS_READ]},
        headers=member.headers,
    )
    assert r.status_code == 201, r.text
    reader = {"Authorization": f"Bearer {r.json()['data']['token']}"}
    assert (await client.get(f"/flows/{fid}/versions", headers=reader)).status_code == 200
    assert (await client.get(f"/flows/{fid}/versions/2", headers=reader)).status_code == 200
    r = await client.post(f"/flows/{fid}/versions/1/restore", headers=reader)
    assert r.status_code == 403, r.text

    # Anonymous callers: 401, and nothing of the flow in the answer.
    for method, path in (
        ("GET", f"/flows/{fid}/versions"),
        ("GET", f"/flows/{fid}/versions/1"),
        ("POST", f"/flows/{fid}/versions/1/restore"),
    ):
        r = await client.request(method, path)
        assert r.status_code == 401
        assert fid not in r.text
    assert len((await _versions(client, member, fid))["data"]) == 2  # no restore happened


async def test_deleting_a_flow_forgets_its_versions(client: httpx.AsyncClient, admin: Account) -> None:
    fid = (await _create(client, admin))["id"]
    await _patch(client, admin, fid, {"graph": OTHER_GRAPH})
    assert (await client.delete(f"/flows/{fid}", headers=admin.headers)).status_code == 200
    assert (await client.get(f"/flows/{fid}/versions", headers=admin.headers)).status_code == 404


async def test_executions_name_the_version_they_ran(engine_client: httpx.AsyncClient, admin: Account) -> None:
    c = engine_client
    fid = (await _create(c, admin))["id"]

    async def run() -> dict[str, Any]:
        assert (await c.post(f"/flows/{fid}/start", headers=admin.headers)).status_code == 200

        async def active() -> bool:
            return (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]["status"] == "active"

        await wait_until(active, within=60)
        r = await c.post(f"/webhooks/{fid}", json={"order": 1})
        assert r.status_code == 202, r.text
        eid = r.json()["data"]["executionId"]

        async def done() -> dict[str, Any] | None:
            e = (await c.get(f"/executions/{eid}", headers=admin.headers)).json()["data"]
            return e if e["status"] in ("succeeded", "failed") else None

        e: dict[str, Any] = await wait_until(done, within=60)
        assert (await c.post(f"/flows/{fid}/stop", headers=admin.headers)).status_code == 200

        async def inactive() -> bool:
            return (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"][
                "status"
            ] == "inactive"

        await wait_until(inactive, within=60)
        return e

    first = await run()
    assert first["status"] == "succeeded" and first["flowVersion"] == 1
    await _patch(c, admin, fid, {"graph": OTHER_GRAPH})
    second = await run()
    assert second["status"] == "succeeded" and second["flowVersion"] == 2
    listed = await c.get(f"/executions?filter[flowId]={fid}", headers=admin.headers)
    assert listed.status_code == 200, listed.text
    assert sorted(e["flowVersion"] for e in listed.json()["data"]) == [1, 2]


async def test_an_execution_runs_the_version_it_names(
    engine_client: httpx.AsyncClient, admin: Account, db: Database
) -> None:
    """An execution accepted under version 1 (a retry, a replay, one still queued) runs
    version 1's graph even though the flow has moved on to version 2 (its nodes differ)."""
    c = engine_client
    fid = (await _create(c, admin))["id"]
    renamed = {
        "nodes": [
            {"id": "in", "componentId": "webhook", "function": "receive"},
            {"id": "second", "componentId": "log", "fields": {"level": "info"}},
        ],
        "edges": [{"source": "in", "target": "second"}],
    }
    await _patch(c, admin, fid, {"graph": renamed})
    assert (await c.post(f"/flows/{fid}/start", headers=admin.headers)).status_code == 200

    async def active() -> bool:
        return (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]["status"] == "active"

    await wait_until(active, within=60)
    async with db.write() as session:
        row_version = await session.scalar(sa.select(Flow.version).where(Flow.id == fid))
        assert row_version == 2
        old = new_id()
        await queue.enqueue(
            session,
            [
                queue.NewExecution(
                    id=old,
                    flow_id=fid,
                    flow_version=1,  # the row's counter when version 1 was current
                    history_version=1,
                    flow_name="f",
                    tenant=None,
                    owner_user=admin.id,
                    trigger="manual",
                    input={"n": 1},
                    created_at=utcnow(),
                )
            ],
        )
    r = await c.post(f"/webhooks/{fid}", json={"n": 2})
    assert r.status_code == 202, r.text
    new = r.json()["data"]["executionId"]

    async def done(eid: str) -> dict[str, Any] | None:
        e = (await c.get(f"/executions/{eid}", headers=admin.headers)).json()["data"]
        return e if e["status"] in ("succeeded", "failed") else None

    ran_old = await wait_until(lambda: done(old), within=60)
    ran_new = await wait_until(lambda: done(new), within=60)
    assert (ran_old["flowVersion"], [s["nodeId"] for s in ran_old["steps"]]) == (1, ["in", "out"])
    assert (ran_new["flowVersion"], [s["nodeId"] for s in ran_new["steps"]]) == (2, ["in", "second"])


async def test_flows_created_together_each_get_version_one(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post(
        "/flows", json=[flow_body("a"), flow_body("b", cron="0 * * * *")], headers=admin.headers
    )
    assert r.status_code == 201, r.text
    for made in r.json()["data"]:
        assert made["version"] == 1
        listed = await _versions(client, admin, made["id"])
        assert [(v["version"], v["author"]) for v in listed["data"]] == [(1, admin.id)]
        one = (await client.get(f"/flows/{made['id']}/versions/1", headers=admin.headers)).json()["data"]
        assert one["cron"] == made["cron"] and one["graph"] == made["graph"]
