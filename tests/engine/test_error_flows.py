"""Error flows (SPEC §11, issue 18), on SQLite and PostgreSQL with the real engine: a flow's
``errorFlowId`` is validated on save (another flow its owners see, not itself) and served; when
an execution ends failed (an outcome, or the reaper giving up on it) one execution of the error
flow runs with trigger ``error`` and the failure's data, counted for the error flow; nothing for
a success; an error flow's own failure starts nothing further; an inactive error flow is not
started and the failed execution's logs say so."""

from __future__ import annotations

from typing import Any

import httpx
import sqlalchemy as sa

from flowyard.db.session import Database
from flowyard.queue import store as queue
from flowyard.queue.models import Execution
from tests.conftest import Account, Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow, finished
from tests.netfixtures import MakeClient, configured

__all__ = ["configured"]

Client = httpx.AsyncClient


def failing_flow(**extra: Any) -> dict[str, Any]:
    """webhook → pick (fails unless the data has ``value``)."""
    return flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "pick", "componentId": "jsonata", "fields": {"expression": "value"}},
            ],
            "edges": [{"source": "in", "target": "pick"}],
        },
        **extra,
    )


def handler_flow(
    expression: str = '{"seen": execution.id, "source": $$.input}', **extra: Any
) -> dict[str, Any]:
    return flow_body(
        name="on failure",
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "note", "componentId": "jsonata", "fields": {"expression": expression}},
            ],
            "edges": [{"source": "in", "target": "note"}],
        },
        **extra,
    )


async def executions_of(c: Client, who: Account, fid: str) -> list[dict[str, Any]]:
    r = await c.get(f"/flows/{fid}/executions", params={"page[size]": "100"}, headers=who.headers)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


async def flow_counts(c: Client, who: Account) -> dict[str, int]:
    r = await c.get("/icenter/executions", params={"groupby": "flow"}, headers=who.headers)
    assert r.status_code == 200, r.text
    return {rec["flow"]: rec["executions"] for rec in r.json()["data"]}


async def test_error_flow_runs_once_per_failure_with_its_data(
    engine_client: Client, factory: Factory
) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    handler = await active_flow(c, member, handler_flow())
    fid = await active_flow(c, member, failing_flow(errorFlowId=handler))
    flow = (await c.get(f"/flows/{fid}", headers=member.headers)).json()["data"]
    assert flow["errorFlowId"] == handler

    good = (await c.post(f"/webhooks/{fid}", json={"value": 1})).json()["data"]["executionId"]
    bad = (await c.post(f"/webhooks/{fid}", json={"other": 2})).json()["data"]["executionId"]
    assert (await finished(c, member, good))["status"] == "succeeded"
    failed = await finished(c, member, bad)
    assert failed["status"] == "failed"

    async def one_error_run() -> list[dict[str, Any]]:
        return await executions_of(c, member, handler)

    runs = await wait_until(one_error_run, within=30)
    assert len(runs) == 1  # none for the success
    run = await finished(c, member, runs[0]["id"])
    assert run["status"] == "succeeded", run
    assert run["trigger"] == "error" and run["parentExecutionId"] == bad
    assert run["input"] == {
        "execution": {"id": bad, "flowId": fid, "error": failed["error"], "step": "pick"},
        "input": {"other": 2},
    }
    assert run["result"] == {"data": {"seen": bad, "source": {"other": 2}}}
    assert run["tenant"] == tenant
    # Counted for the error flow, as one execution.
    assert (await flow_counts(c, member)).get(handler) == 1
    assert len(await executions_of(c, member, handler)) == 1


async def test_an_error_flows_own_failure_starts_nothing(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    # A handler that fails itself, and names the failing flow as its own error flow: no loop.
    handler_id = (
        await c.post("/flows", json=handler_flow('$error("handler broke")'), headers=member.headers)
    ).json()["data"]["id"]
    fid = await active_flow(c, member, failing_flow(errorFlowId=handler_id))
    r = await c.patch(f"/flows/{handler_id}", json={"errorFlowId": fid}, headers=member.headers)
    assert r.status_code == 200, r.text
    r = await c.post(f"/flows/{handler_id}/start", headers=member.headers)
    assert r.status_code == 200

    async def handler_active() -> bool:
        return (await c.get(f"/flows/{handler_id}", headers=member.headers)).json()["data"][
            "status"
        ] == "active"

    await wait_until(handler_active)
    bad = (await c.post(f"/webhooks/{fid}", json={})).json()["data"]["executionId"]
    assert (await finished(c, member, bad))["status"] == "failed"
    runs = await wait_until(lambda: executions_of(c, member, handler_id), within=30)
    assert (await finished(c, member, runs[0]["id"]))["status"] == "failed"
    # Once the handler's failure is recorded, the failing flow ran only the one execution.
    ran = await executions_of(c, member, fid)
    assert [e["id"] for e in ran] == [bad]
    assert len(await executions_of(c, member, handler_id)) == 1


async def test_inactive_error_flow_is_not_started(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    handler = (await c.post("/flows", json=handler_flow(), headers=member.headers)).json()["data"]["id"]
    fid = await active_flow(c, member, failing_flow(errorFlowId=handler))
    bad = (await c.post(f"/webhooks/{fid}", json={})).json()["data"]["executionId"]
    assert (await finished(c, member, bad))["status"] == "failed"

    async def warned() -> list[dict[str, Any]]:
        r = await c.get(
            "/logs", params={"filter[tenant]": tenant, "filter[executionId]": bad}, headers=member.headers
        )
        return [e for e in r.json()["data"] if e["level"] == "warn" and handler in e["message"]]

    assert "is not active" in (await wait_until(warned))[0]["message"]
    assert await executions_of(c, member, handler) == []


async def test_an_error_flow_is_claimed_at_once_not_at_the_poll(
    configured: MakeClient, factory: Factory
) -> None:
    """The failure's record wakes the engines for the error flow it queued, as any enqueue does:
    with the workers' poll at 30 s and nothing else queued, the error flow still runs within
    seconds (a worker claims only when woken, or after a claim that filled its limit)."""
    c = await configured(poll_interval=30)
    member = await factory.user(tenant=await factory.tenant())
    handler = await active_flow(c, member, handler_flow())
    fid = await active_flow(c, member, failing_flow(errorFlowId=handler))
    bad = (await c.post(f"/webhooks/{fid}", json={"other": 1})).json()["data"]["executionId"]
    assert (await finished(c, member, bad))["status"] == "failed"
    runs = await wait_until(lambda: executions_of(c, member, handler), within=10)
    assert [r["parentExecutionId"] for r in runs] == [bad]
    assert (await finished(c, member, runs[0]["id"]))["status"] == "succeeded"


async def test_the_reapers_failure_starts_the_error_flow(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    """An execution the reaper fails (its worker died too often) starts the error flow too."""
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    handler = await active_flow(c, member, handler_flow())
    fid = await active_flow(c, member, failing_flow(errorFlowId=handler))
    eid = (await c.post(f"/webhooks/{fid}", json={"value": 1})).json()["data"]["executionId"]
    assert (await finished(c, member, eid))["status"] == "succeeded"
    # Make it look like a run whose worker died once too often, then reap it.
    async with db.write() as session:
        await session.execute(
            sa.update(Execution)
            .where(Execution.id == eid)
            .values(status="running", lease_owner="dead-worker", attempts=9, finished_at=None)
        )
        _requeued, dead = await queue.reap(session, max_attempts=3, owners=["dead-worker"])
        assert [e.id for e in dead] == [eid]
    runs = await wait_until(lambda: executions_of(c, member, handler), within=30)
    run = await finished(c, member, runs[0]["id"])
    assert run["parentExecutionId"] == eid
    assert run["input"]["execution"]["step"] is None  # no step failed: its worker died
    assert "abandoned" in run["input"]["execution"]["error"]


async def test_error_flow_id_is_validated(client: Client, factory: Factory) -> None:
    c = client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    stranger = await factory.user(tenant=await factory.tenant())
    theirs = (await c.post("/flows", json=handler_flow(), headers=stranger.headers)).json()["data"]["id"]
    mine = (await c.post("/flows", json=handler_flow(), headers=member.headers)).json()["data"]["id"]
    for bad, text in (
        ("nope", "must be a flow id"),
        (42, "must be a flow id"),
        (theirs, "must name a flow this flow's owners can see"),
        ("0" * 24, "must name a flow this flow's owners can see"),
    ):
        r = await c.post("/flows", json=failing_flow(errorFlowId=bad), headers=member.headers)
        assert r.status_code == 400, r.text
        assert r.json()["errors"][0]["field"] == "errorFlowId" and text in r.json()["errors"][0]["message"]
    r = await c.patch(f"/flows/{mine}", json={"errorFlowId": mine}, headers=member.headers)
    assert r.status_code == 400
    assert r.json()["errors"][0] == {
        "message": "must name another flow, not this one",
        "code": 400,
        "field": "errorFlowId",
    }
    fid = (await c.post("/flows", json=failing_flow(errorFlowId=mine), headers=member.headers)).json()[
        "data"
    ]["id"]
    r = await c.patch(f"/flows/{fid}", json={"name": "renamed"}, headers=member.headers)
    assert r.json()["data"]["errorFlowId"] == mine  # kept when not named
    r = await c.patch(f"/flows/{fid}", json={"errorFlowId": None}, headers=member.headers)
    assert r.status_code == 200 and r.json()["data"]["errorFlowId"] is None
    # Start checks it again: an error flow deleted since the save stops the start (409).
    other = (await c.post("/flows", json=failing_flow(errorFlowId=mine), headers=member.headers)).json()[
        "data"
    ]["id"]
    assert (await c.delete(f"/flows/{mine}", headers=member.headers)).status_code == 200
    r = await c.post(f"/flows/{other}/start", headers=member.headers)
    assert r.status_code == 409, r.text
    assert r.json()["errors"][0]["field"] == "errorFlowId"
    assert "no longer a flow this flow's owners can see" in r.json()["errors"][0]["message"]
