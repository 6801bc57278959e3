"""Replay and cancel (SPEC §11, issue 18): ``POST /executions/{id}/retry`` from the failed step
with its stored input and the earlier steps carried over, ``/rerun`` from the trigger data,
``/cancel`` of queued, waiting and running executions (a running step is interrupted), the 409
cases, and who may (SPEC §2): another tenant's member 404, a token narrowed to
``tenant.flows.read`` 403, anonymous 401, a tenantless user on its own flows. On SQLite and
PostgreSQL; the engine runs where executions must run, else they stay queued."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from flowyard.app import create_app
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.queue import status as execution_status
from flowyard.queue import store as queue
from flowyard.queue.models import Execution
from flowyard.queue.status import ExecutionStatus
from tests.api.test_access import cheap_password_hashing, narrowed, set_active
from tests.conftest import Account, Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow, finished

__all__ = ["cheap_password_hashing"]

Client = httpx.AsyncClient


@pytest.fixture
def engine_settings(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The engine of conftest, with room for a long ``delay`` step to be interrupted and leases
    renewed (and cancellations seen) every second. The delay runs in its runner rather than
    parking the execution (SPEC §11 parks delays longer than FLOWYARD_DELAY_PARK_SECONDS)."""
    monkeypatch.setenv("FLOWYARD_DELAY_PARK_SECONDS", "3600")
    return Settings(
        data_dir=tmp_path,
        database_url=db_url,
        poll_interval=0.05,
        scheduler_interval=0.2,
        lease_seconds=3,
        stop_grace_seconds=2,
        step_timeout=600,
        execution_wall_seconds=600,
        webhook_group_commit_ms=1,
        runners=1,
    )


@pytest.fixture
async def engine_app(engine_settings: Settings, db: Database, registry: Registry) -> AsyncIterator[FastAPI]:
    app = create_app(engine_settings, db=db, registry=registry, run_engine=True)
    async with app.router.lifespan_context(app):
        yield app


def two_step_flow(check: str) -> dict[str, Any]:
    """webhook → prep (adds one to n) → check (``check``, JSONata)."""
    return flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "prep", "componentId": "jsonata", "fields": {"expression": '{"v": v, "n": n + 1}'}},
                {"id": "check", "componentId": "jsonata", "fields": {"expression": check}},
            ],
            "edges": [{"source": "in", "target": "prep"}, {"source": "prep", "target": "check"}],
        }
    )


async def stop(c: Client, who: Account, fid: str) -> None:
    r = await c.post(f"/flows/{fid}/stop", headers=who.headers)
    assert r.status_code == 200, r.text

    async def inactive() -> bool:
        return (await c.get(f"/flows/{fid}", headers=who.headers)).json()["data"]["status"] == "inactive"

    await wait_until(inactive, within=30)


async def start(c: Client, who: Account, fid: str) -> None:
    r = await c.post(f"/flows/{fid}/start", headers=who.headers)
    assert r.status_code == 200, r.text

    async def active() -> bool:
        return (await c.get(f"/flows/{fid}", headers=who.headers)).json()["data"]["status"] == "active"

    await wait_until(active, within=30)


async def detail(c: Client, who: Account, eid: str) -> dict[str, Any]:
    r = await c.get(f"/executions/{eid}", headers=who.headers)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def step(e: dict[str, Any], node: str) -> dict[str, Any]:
    return next(s for s in e["steps"] if s["nodeId"] == node)


async def test_retry_goes_on_at_the_failed_step_and_rerun_starts_over(
    engine_client: Client, factory: Factory
) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    fid = await active_flow(c, member, two_step_flow('$error("partner down")'))
    eid = (await c.post(f"/webhooks/{fid}", json={"v": "a", "n": 1})).json()["data"]["executionId"]
    failed = await finished(c, member, eid)
    assert failed["status"] == "failed"
    failed = await detail(c, member, eid)
    assert step(failed, "check")["status"] == "failed"
    # The failed step keeps the message it failed on: prep's output.
    assert step(failed, "check")["input"]["data"] == {"v": "a", "n": 2}
    assert "input" not in step(failed, "prep")

    # The partner is back: the step is fixed; prep must not run again on retry.
    await stop(c, member, fid)
    graph = failed_graph = (await c.get(f"/flows/{fid}", headers=member.headers)).json()["data"]["graph"]
    graph["nodes"][2]["fields"]["expression"] = '{"got": v, "n": n * 10}'
    r = await c.patch(f"/flows/{fid}", json={"graph": failed_graph}, headers=member.headers)
    assert r.status_code == 200, r.text
    await start(c, member, fid)

    r = await c.post(f"/executions/{eid}/retry", headers=member.headers)
    assert r.status_code == 202, r.text
    retried = r.json()["data"]
    assert retried["retryOf"] == eid and retried["rerunOf"] is None and retried["id"] != eid
    assert retried["flowId"] == fid and retried["input"] == {"v": "a", "n": 1}
    done = await finished(c, member, retried["id"])
    assert done["status"] == "succeeded", done
    assert done["result"] == {"data": {"got": "a", "n": 20}}
    again = await detail(c, member, retried["id"])
    # prep was carried over, not run again: the same record as in the failed execution.
    assert step(again, "prep") == step(failed, "prep")
    assert step(again, "check")["status"] == "succeeded" and step(again, "check")["runs"] == 1

    # A succeeded execution is not retried.
    r = await c.post(f"/executions/{retried['id']}/retry", headers=member.headers)
    assert r.status_code == 409
    assert "failed or cancelled" in r.json()["errors"][0]["message"]

    # Re-run: from the trigger data, every step runs again on the current version.
    r = await c.post(f"/executions/{eid}/rerun", headers=member.headers)
    assert r.status_code == 202, r.text
    rerun = r.json()["data"]
    assert rerun["rerunOf"] == eid and rerun["retryOf"] is None
    done = await finished(c, member, rerun["id"])
    assert done["status"] == "succeeded" and done["result"] == {"data": {"got": "a", "n": 20}}
    fresh = await detail(c, member, rerun["id"])
    assert step(fresh, "prep")["startedAt"] != step(failed, "prep")["startedAt"]

    # A stopped flow runs nothing: both answer 409.
    await stop(c, member, fid)
    for action in ("retry", "rerun"):
        r = await c.post(f"/executions/{eid}/{action}", headers=member.headers)
        assert r.status_code == 409, r.text
        assert r.json()["errors"][0] == {
            "message": "Flow is not active. Current status: inactive",
            "code": 409,
        }


async def test_retry_starts_at_the_step_that_failed_the_execution_not_a_handled_one(
    engine_client: Client, factory: Factory
) -> None:
    """A step whose failure a failure edge took keeps its input (the step debugger shows it),
    and the execution fails later at another step: a retry goes on at that later step."""
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    body = flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "first", "componentId": "jsonata", "fields": {"expression": '$error("first down")'}},
                {"id": "fix", "componentId": "jsonata", "fields": {"expression": '{"fixed": true}'}},
                {"id": "check", "componentId": "jsonata", "fields": {"expression": '$error("later")'}},
            ],
            "edges": [
                {"source": "in", "target": "first"},
                {"source": "first", "target": "fix", "on": "failure"},
                {"source": "fix", "target": "check"},
            ],
        }
    )
    fid = await active_flow(c, member, body)
    eid = (await c.post(f"/webhooks/{fid}", json={"n": 1})).json()["data"]["executionId"]
    assert (await finished(c, member, eid))["status"] == "failed"
    failed = await detail(c, member, eid)
    assert step(failed, "first")["status"] == "failed"
    assert step(failed, "first")["input"]["data"] == {"n": 1}
    assert step(failed, "check")["input"]["data"] == {"fixed": True}
    # Every step keeps a sample of the data it received (the step debugger's input).
    assert step(failed, "first")["inputs"] == [{"n": 1}]
    assert step(failed, "check")["inputs"] == [{"fixed": True}]
    await stop(c, member, fid)
    graph = (await c.get(f"/flows/{fid}", headers=member.headers)).json()["data"]["graph"]
    graph["nodes"][3]["fields"]["expression"] = '{"ok": fixed}'
    assert (await c.patch(f"/flows/{fid}", json={"graph": graph}, headers=member.headers)).status_code == 200
    await start(c, member, fid)
    r = await c.post(f"/executions/{eid}/retry", headers=member.headers)
    assert r.status_code == 202, r.text
    done = await finished(c, member, r.json()["data"]["id"])
    assert done["status"] == "succeeded" and done["result"] == {"data": {"ok": True}}, done
    again = await detail(c, member, done["id"])
    # first and fix were carried over, not run again (a carried record keeps no input).
    assert step(again, "first") == {k: v for k, v in step(failed, "first").items() if k != "input"}
    assert step(again, "fix") == step(failed, "fix")


async def test_retry_refuses_a_step_gone_from_the_flow(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(c, member, two_step_flow('$error("down")'))
    eid = (await c.post(f"/webhooks/{fid}", json={"v": 1, "n": 1})).json()["data"]["executionId"]
    assert (await finished(c, member, eid))["status"] == "failed"
    await stop(c, member, fid)
    graph = (await c.get(f"/flows/{fid}", headers=member.headers)).json()["data"]["graph"]
    graph["nodes"] = graph["nodes"][:2]
    graph["edges"] = graph["edges"][:1]
    assert (await c.patch(f"/flows/{fid}", json={"graph": graph}, headers=member.headers)).status_code == 200
    await start(c, member, fid)
    r = await c.post(f"/executions/{eid}/retry", headers=member.headers)
    assert r.status_code == 409
    assert "Step check is no longer in flow" in r.json()["errors"][0]["message"]


async def test_cancel_interrupts_a_running_step(
    engine_app: FastAPI, engine_client: Client, factory: Factory
) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(
        c,
        member,
        flow_body(
            graph={
                "nodes": [
                    {"id": "in", "componentId": "webhook"},
                    {"id": "wait", "componentId": "delay", "fields": {"seconds": 3000}},
                ],
                "edges": [{"source": "in", "target": "wait"}],
            }
        ),
    )
    eid = (await c.post(f"/webhooks/{fid}", json={"x": 1})).json()["data"]["executionId"]
    worker = engine_app.state.engine.worker

    async def running() -> bool:
        return (await detail(c, member, eid))["status"] == "running" and eid in worker._running

    await wait_until(running, within=30)
    r = await c.post(f"/executions/{eid}/cancel", headers=member.headers)
    assert r.status_code == 200, r.text
    body = r.json()["data"]
    assert body["id"] == eid and body["status"] == "cancelled" and body["finishedAt"]
    assert "cancelled on request" in body["error"]

    async def interrupted() -> bool:
        return eid not in worker._running

    # The step would sleep for 50 minutes; the worker lets go of it at its next lease renewal.
    await wait_until(interrupted, within=60)
    assert (await detail(c, member, eid))["status"] == "cancelled"
    r = await c.post(f"/executions/{eid}/cancel", headers=member.headers)
    assert r.status_code == 409
    assert "is cancelled" in r.json()["errors"][0]["message"]
    # A cancelled execution may be retried (from its trigger: no step failed); it runs again.
    r = await c.post(f"/executions/{eid}/retry", headers=member.headers)
    assert r.status_code == 202, r.text
    again = r.json()["data"]["id"]
    assert (await c.post(f"/executions/{again}/cancel", headers=member.headers)).status_code == 200


async def queued_execution(client: Client, db: Database, who: Account, fid: str) -> str:
    await set_active(db, fid)
    r = await client.post(f"/flows/{fid}/executions", json={"n": 1}, headers=who.headers)
    assert r.status_code == 202, r.text
    return str(r.json()["data"]["executionId"])


async def test_cancel_queued_and_waiting(client: Client, db: Database, factory: Factory) -> None:
    member = await factory.user(tenant=await factory.tenant())
    r = await client.post("/flows", json=flow_body(), headers=member.headers)
    fid = r.json()["data"]["id"]
    queued = await queued_execution(client, db, member, fid)
    # Neither retried (not failed) nor re-run (not finished) while it is queued.
    for action, text in (("retry", "failed or cancelled"), ("rerun", "only a finished execution")):
        r = await client.post(f"/executions/{queued}/{action}", headers=member.headers)
        assert r.status_code == 409 and text in r.json()["errors"][0]["message"], r.text
    r = await client.post(f"/executions/{queued}/cancel", headers=member.headers)
    assert r.status_code == 200 and r.json()["data"]["status"] == "cancelled", r.text

    # A waiting execution (parked: claimed, then waiting with its resume time).
    waiting = await queued_execution(client, db, member, fid)
    async with db.write() as session:
        claimed = await queue.claim(session, worker_id="w", limit=10, lease_seconds=30, cap=0)
        assert [x.id for x in claimed] == [waiting]
        await session.execute(
            execution_status.update(ExecutionStatus.RUNNING, ExecutionStatus.WAITING)
            .where(Execution.id == waiting)
            .values(resume_at=utcnow() + timedelta(hours=1), lease_owner=None, lease_expires_at=None)
        )
    e = (await client.get(f"/executions/{waiting}", headers=member.headers)).json()["data"]
    assert e["status"] == "waiting" and e["resumeAt"]
    r = await client.post(f"/executions/{waiting}/cancel", headers=member.headers)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["status"] == "cancelled" and r.json()["data"]["resumeAt"] is None
    # The logs say who cancelled it.
    logs = (
        await client.get(
            "/logs",
            params={"filter[tenant]": member.tenant or "", "filter[executionId]": waiting},
            headers=member.headers,
        )
    ).json()["data"]
    assert any("cancelled on request of user" in entry["message"] for entry in logs)


async def test_who_may_replay_and_cancel(client: Client, db: Database, factory: Factory) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    stranger = await factory.user(tenant=await factory.tenant())
    loner = await factory.user()  # tenantless
    r = await client.post("/flows", json=flow_body(), headers=member.headers)
    fid = r.json()["data"]["id"]
    eid = await queued_execution(client, db, member, fid)
    reader = await narrowed(client, member, "tenant.flows.read")
    missing = "0" * 24
    for action in ("retry", "rerun", "cancel"):
        # Anonymous: 401, whether the execution exists or not.
        for target in (eid, missing):
            r = await client.post(f"/executions/{target}/{action}")
            assert r.status_code == 401, r.text
            assert "errors" in r.json()
        # A malformed id: 400.
        r = await client.post(f"/executions/nope/{action}", headers=member.headers)
        assert r.status_code == 400
        # Another tenant's member and a tenantless user: 404, as for an id that does not exist.
        for who in (stranger, loner):
            for target in (eid, missing):
                r = await client.post(f"/executions/{target}/{action}", headers=who.headers)
                assert r.status_code == 404, r.text
                assert r.json()["errors"][0]["message"] == f"Execution {target} not found."
        # A token narrowed to reading: 403 (it may read the execution, not act on it).
        r = await client.post(f"/executions/{eid}/{action}", headers=reader)
        assert r.status_code == 403, r.text
        assert (await client.get(f"/executions/{eid}", headers=reader)).status_code == 200
    assert (await client.get(f"/executions/{eid}", headers=member.headers)).json()["data"][
        "status"
    ] == "queued"

    # A tenantless user acts on the executions of its own flows.
    r = await client.post("/flows", json=flow_body(), headers=loner.headers)
    own = await queued_execution(client, db, loner, r.json()["data"]["id"])
    r = await client.post(f"/executions/{own}/cancel", headers=loner.headers)
    assert r.status_code == 200 and r.json()["data"]["status"] == "cancelled"
    await set_active(db, r.json()["data"]["flowId"])
    r = await client.post(f"/executions/{own}/rerun", headers=loner.headers)
    assert r.status_code == 202 and r.json()["data"]["rerunOf"] == own
    assert r.json()["data"]["status"] == "queued" and r.json()["data"]["user"] == loner.id
    # ...which the member of a tenant cannot touch.
    assert (await client.post(f"/executions/{own}/retry", headers=member.headers)).status_code == 404
