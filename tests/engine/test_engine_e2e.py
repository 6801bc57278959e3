"""The engine end to end over HTTP, on SQLite and PostgreSQL: lifecycle,
webhooks, cron, executions, logs and counts."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from flowyard.queue import pruner
from flowyard.queue.models import Execution
from flowyard.triggers import lifecycle
from flowyard.webhooks.signature import signature_header
from tests.conftest import Account, Factory, flow_body, wait_until

Client = httpx.AsyncClient


async def active_flow(c: Client, who: Account, body: dict[str, Any]) -> str:
    r = await c.post("/flows", json=body, headers=who.headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    r = await c.post(f"/flows/{fid}/start", headers=who.headers)
    assert r.json() == {"data": {"id": fid, "status": "starting"}, "meta": {}}

    async def is_active() -> bool:
        flow = (await c.get(f"/flows/{fid}", headers=who.headers)).json()["data"]
        assert flow["status"] in ("starting", "active"), flow
        return flow["status"] == "active"

    await wait_until(is_active)
    return fid


async def finished(c: Client, who: Account, eid: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        r = await c.get(f"/executions/{eid}", headers=who.headers)
        assert r.status_code == 200, r.text
        e = r.json()["data"]
        return e if e["status"] in ("succeeded", "failed", "cancelled") else None

    result: dict[str, Any] = await wait_until(done)
    return result


def mapper_flow(**extra: Any) -> dict[str, Any]:
    return flow_body(
        graph={
            "nodes": [{"id": "in", "componentId": "webhook"}, {"id": "out", "componentId": "log"}],
            "edges": [
                {
                    "source": "in",
                    "target": "out",
                    "config": {"mapper": {"orderId": "id", "n": "$count(items)"}},
                }
            ],
        },
        **extra,
    )


async def test_typical_use_end_to_end(engine_client: Client, factory: Factory) -> None:
    """The seed's typical use: list active flows, read the owner's username, post, then see it everywhere."""
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    fid = await active_flow(c, member, mapper_flow(name="orders"))

    listing = (await c.get("/flows", params={"filter[status]": "active"}, headers=member.headers)).json()
    assert [f["id"] for f in listing["data"]] == [fid]
    owner = next(o["id"] for o in listing["data"][0]["owners"] if o["type"] == "user")
    user = (await c.get(f"/api/users/{owner}", headers=member.headers)).json()
    assert user["username"] == member.username

    r = await c.post(f"/webhooks/{fid}", json={"id": "A-1", "items": [1, 2, 3]})
    assert r.status_code == 202
    accepted = r.json()
    assert accepted["data"]["flowId"] == fid and accepted["data"]["status"] == "queued"
    e = await finished(c, member, accepted["data"]["executionId"])
    assert e["status"] == "succeeded", e
    assert e["trigger"] == "webhook" and e["input"] == {"id": "A-1", "items": [1, 2, 3]}
    assert e["result"] == {"data": {"orderId": "A-1", "n": 3}}
    assert [s["nodeId"] for s in e["steps"]] == ["in", "out"]

    listed = (await c.get("/executions", params={"filter[flowId]": fid}, headers=member.headers)).json()
    assert listed["meta"]["total"] == 1 and listed["data"][0]["id"] == e["id"]

    logs = (
        await c.get("/logs", params={"filter[tenant]": tenant, "filter[flowId]": fid}, headers=member.headers)
    ).json()
    assert {entry["stepId"] for entry in logs["data"]} == {"in", "out"}
    assert all(entry["executionId"] == e["id"] for entry in logs["data"])
    logged = [entry for entry in logs["data"] if entry["message"] == "message"]
    assert logged and logged[0]["data"] == {"orderId": "A-1", "n": 3}

    for groupby, keys in (("user", [member.id]), ("flow", [fid]), ("component", ["log", "webhook"])):
        counts = (
            await c.get("/icenter/executions", params={"groupby": groupby}, headers=member.headers)
        ).json()
        assert counts["metadata"]["totalExecutions"] == 1
        assert [rec["_id"] for rec in counts["data"]] == keys
    by_user = (await c.get("/icenter/executions", headers=member.headers)).json()["data"][0]
    assert by_user == {
        "_id": member.id,
        "user": member.id,
        "tenant": tenant,
        "allFlows": [fid],
        "executions": 1,
        "username": member.username,
    }


async def test_start_of_unrunnable_flow_returns_to_inactive(
    engine_client: Client, admin: Account, db: Database
) -> None:
    c = engine_client
    fid = (await c.post("/flows", json=flow_body(), headers=admin.headers)).json()["data"]["id"]
    broken = {"nodes": [{"id": "in", "componentId": "uninstalled-thing"}], "edges": []}
    async with db.write() as session:
        await session.execute(sa.update(Flow).where(Flow.id == fid).values(graph=broken))
    # The start answer says why at once (issue 22) and leaves the flow inactive.
    r = await c.post(f"/flows/{fid}/start", headers=admin.headers)
    assert r.status_code == 409, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["graph.nodes[0].componentId"]
    assert "uninstalled-thing" in r.json()["errors"][0]["message"]
    assert (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]["status"] == "inactive"
    # The engine keeps its own check for what changes after the start was accepted: a flow
    # found 'starting' with a component gone goes back to inactive with the reason.
    async with db.write() as session:
        await session.execute(
            sa.update(Flow).where(Flow.id == fid).values(status="starting", status_changed_at=utcnow())
        )

    async def settled() -> dict[str, Any] | None:
        flow = (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]
        return flow if flow["status"] == "inactive" else None

    flow = await wait_until(settled)
    assert "uninstalled-thing" in flow["statusMessage"]


async def test_webhook_refusals(engine_client: Client, admin: Account) -> None:
    c = engine_client
    fid = (await c.post("/flows", json=flow_body(), headers=admin.headers)).json()["data"]["id"]
    for target in (fid, "0" * 24, "not-an-id"):
        r = await c.post(f"/webhooks/{target}", json={})
        assert r.status_code == 404
        assert r.json()["errors"][0]["message"].endswith("either does not exist or is inactive.")
    cron_id = await active_flow(c, admin, flow_body(name="cron", cron="0 0 1 1 *"))
    r = await c.post(f"/webhooks/{cron_id}", json={})
    assert r.status_code == 409 and "runs on a schedule" in r.json()["errors"][0]["message"]
    live = await active_flow(c, admin, flow_body(name="live"))
    r = await c.post(
        f"/webhooks/{live}", content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 415
    r = await c.post(f"/webhooks/{live}", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = await c.post(
        f"/webhooks/{live}", content=b'{"x": "\xff"}', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    listed = (await c.get("/executions", headers=admin.headers)).json()
    assert listed["meta"]["total"] == 0


async def test_signed_webhooks(engine_client: Client, admin: Account) -> None:
    c = engine_client
    secret = "s3cret-s3cret-s3cret"
    fid = await active_flow(c, admin, flow_body(webhookSecret=secret))
    flow = (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]
    assert flow["webhookSigned"] is True and "webhookSecret" not in flow
    body = b'{"a": 1}'
    r = await c.post(f"/webhooks/{fid}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 401
    sig = signature_header(secret, body, int(time.time()))
    r = await c.post(
        f"/webhooks/{fid}",
        content=body,
        headers={"Content-Type": "application/json", "X-Flowyard-Signature": sig},
    )
    assert r.status_code == 202


async def test_idempotency_keys(engine_client: Client, admin: Account) -> None:
    c = engine_client
    fid = await active_flow(c, admin, flow_body())
    other = await active_flow(c, admin, flow_body(name="other"))
    first = await c.post(f"/webhooks/{fid}", json={"n": 1}, headers={"Idempotency-Key": "k-1"})
    again = await c.post(f"/webhooks/{fid}", json={"n": 1}, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    clash = await c.post(f"/webhooks/{fid}", json={"n": 2}, headers={"Idempotency-Key": "k-1"})
    assert clash.status_code == 409
    elsewhere = await c.post(f"/webhooks/{other}", json={"n": 1}, headers={"Idempotency-Key": "k-1"})
    assert elsewhere.status_code == 202
    assert elsewhere.json()["data"]["executionId"] != first.json()["data"]["executionId"]
    await finished(c, admin, first.json()["data"]["executionId"])
    listed = (await c.get("/executions", params={"filter[flowId]": fid}, headers=admin.headers)).json()
    assert listed["meta"]["total"] == 1


async def test_synchronous_replies(engine_client: Client, admin: Account) -> None:
    c = engine_client
    respond = flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "reply", "componentId": "respond", "fields": {"status": 201, "body": "{'echo': q}"}},
            ],
            "edges": [{"source": "in", "target": "reply"}],
        }
    )
    fid = await active_flow(c, admin, respond)
    r = await c.post(f"/webhooks/{fid}", params={"wait": 5}, json={"q": "hi"})
    assert r.status_code == 201 and r.json() == {"echo": "hi"}
    plain = await active_flow(c, admin, mapper_flow(name="plain"))
    r = await c.post(f"/webhooks/{plain}", params={"wait": 5}, json={"id": "B", "items": []})
    assert r.status_code == 200 and r.json() == {"orderId": "B", "n": 0}
    failing = await active_flow(
        c,
        admin,
        flow_body(
            name="failing",
            graph={
                "nodes": [
                    {"id": "in"},
                    {"id": "j", "componentId": "jsonata", "fields": {"expression": "nothing.here"}},
                ],
                "edges": [{"source": "in", "target": "j"}],
            },
        ),
    )
    r = await c.post(f"/webhooks/{failing}", params={"wait": 5}, json={})
    assert r.status_code == 502, r.text
    message = r.json()["errors"][0]["message"]
    assert message.startswith("Execution ") and message.endswith(
        " failed; its details are in the execution and its logs."
    )
    assert "step j" not in message and "nothing.here" not in message
    eid = message.split()[1]
    assert "step j failed" in (await finished(c, admin, eid))["error"]
    slow = await active_flow(
        c,
        admin,
        flow_body(
            name="slow",
            graph={
                "nodes": [{"id": "in"}, {"id": "d", "componentId": "delay", "fields": {"seconds": 1.5}}],
                "edges": [{"source": "in", "target": "d"}],
            },
        ),
    )
    r = await c.post(f"/webhooks/{slow}", params={"wait": 0.2}, json={})
    assert r.status_code == 202 and r.json()["data"]["status"] == "queued"
    for bad in ("0", "61", "abc"):
        assert (await c.post(f"/webhooks/{plain}", params={"wait": bad}, json={})).status_code == 400


async def test_failing_step_fails_only_its_execution(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    fid = await active_flow(
        c,
        member,
        flow_body(
            graph={
                "nodes": [
                    {"id": "in"},
                    {"id": "pick", "componentId": "jsonata", "fields": {"expression": "value"}},
                ],
                "edges": [{"source": "in", "target": "pick"}],
            }
        ),
    )
    bad = (await c.post(f"/webhooks/{fid}", json={"other": 1})).json()["data"]["executionId"]
    good = (await c.post(f"/webhooks/{fid}", json={"value": 7})).json()["data"]["executionId"]
    e_bad, e_good = await finished(c, member, bad), await finished(c, member, good)
    assert e_bad["status"] == "failed" and e_good["status"] == "succeeded"
    assert e_good["result"] == {"data": 7}
    errors = (
        await c.get("/logs", params={"filter[tenant]": tenant, "showErrors": "true"}, headers=member.headers)
    ).json()["data"]
    assert len(errors) == 1
    assert errors[0]["stepId"] == "pick" and errors[0]["componentId"] == "jsonata"
    assert errors[0]["executionId"] == bad and "yielded no value" in errors[0]["message"]


async def test_stop_drains_accepted_executions(engine_client: Client, admin: Account) -> None:
    c = engine_client
    fid = await active_flow(
        c,
        admin,
        flow_body(
            graph={
                "nodes": [{"id": "in"}, {"id": "d", "componentId": "delay", "fields": {"seconds": 0.5}}],
                "edges": [{"source": "in", "target": "d"}],
            }
        ),
    )
    eid = (await c.post(f"/webhooks/{fid}", json={})).json()["data"]["executionId"]
    r = await c.post(f"/flows/{fid}/stop", headers=admin.headers)
    assert r.json() == {"data": {"id": fid, "status": "stopping"}, "meta": {}}
    assert (await c.post(f"/webhooks/{fid}", json={})).status_code == 404

    async def inactive() -> bool:
        return (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]["status"] == "inactive"

    await wait_until(inactive)
    assert (await finished(c, admin, eid))["status"] == "succeeded"


async def test_stop_cancels_what_outlives_the_grace_period(engine_client: Client, admin: Account) -> None:
    c = engine_client  # engine_settings: 2 s grace, 5 s step timeout
    fid = await active_flow(
        c,
        admin,
        flow_body(
            graph={
                "nodes": [{"id": "in"}, {"id": "d", "componentId": "delay", "fields": {"seconds": 4}}],
                "edges": [{"source": "in", "target": "d"}],
            }
        ),
    )
    eid = (await c.post(f"/webhooks/{fid}", json={})).json()["data"]["executionId"]
    await c.post(f"/flows/{fid}/stop", headers=admin.headers)

    async def inactive() -> dict[str, Any] | None:
        flow = (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]
        return flow if flow["status"] == "inactive" else None

    flow = await wait_until(inactive, within=8)
    assert "cancelled" in flow["statusMessage"]
    e = await finished(c, admin, eid)
    assert e["status"] == "cancelled" and "grace" in e["error"]


async def test_cron_fires_each_second_once(engine_client: Client, admin: Account, db: Database) -> None:
    c = engine_client
    fid = await active_flow(c, admin, flow_body(cron="* * * * * *"))
    flow = (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]
    assert flow["nextRunAt"] is not None

    async def two_runs() -> list[dict[str, Any]] | None:
        data = (
            await c.get(
                "/executions",
                params={"filter[flowId]": fid, "filter[status]": "succeeded"},
                headers=admin.headers,
            )
        ).json()["data"]
        return data if len(data) >= 2 else None

    runs = await wait_until(two_runs, within=6)
    await c.post(f"/flows/{fid}/stop", headers=admin.headers)
    ticks = [e["scheduledFor"] for e in runs]
    assert len(set(ticks)) == len(ticks)
    assert all(t.endswith(".000Z") for t in ticks)
    assert all(e["trigger"] == "cron" for e in runs)
    assert runs[0]["input"]["scheduledFor"] == runs[0]["scheduledFor"]


async def test_missed_ticks_make_one_catch_up_run(
    engine_client: Client, admin: Account, db: Database
) -> None:
    c = engine_client
    fid = await active_flow(c, admin, flow_body(cron="*/5 * * * *"))
    async with db.write() as session:
        # As if the service had been down for three hours: 36 ticks were missed.
        await session.execute(
            sa.update(Flow).where(Flow.id == fid).values(next_run_at=utcnow() - timedelta(hours=3))
        )

    async def ran() -> list[Any] | None:
        data = (await c.get("/executions", params={"filter[flowId]": fid}, headers=admin.headers)).json()[
            "data"
        ]
        return data or None

    await wait_until(ran)
    flow = (await c.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]
    assert flow["nextRunAt"] > flow["lastExecutionAt"]
    listed = (await c.get("/executions", params={"filter[flowId]": fid}, headers=admin.headers)).json()
    assert listed["meta"]["total"] == 1


async def test_manual_runs(engine_client: Client, admin: Account) -> None:
    c = engine_client
    inactive = (await c.post("/flows", json=flow_body(), headers=admin.headers)).json()["data"]["id"]
    assert (await c.post(f"/flows/{inactive}/executions", json={}, headers=admin.headers)).status_code == 409
    fid = await active_flow(c, admin, mapper_flow())
    r = await c.post(f"/flows/{fid}/executions", json={"id": "M", "items": [1]}, headers=admin.headers)
    assert r.status_code == 202
    e = await finished(c, admin, r.json()["data"]["executionId"])
    assert e["trigger"] == "manual" and e["result"] == {"data": {"orderId": "M", "n": 1}}


async def test_execution_and_log_visibility(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    t1, t2 = await factory.tenant(), await factory.tenant()
    alice, bob = await factory.user(tenant=t1), await factory.user(tenant=t2)
    fid = await active_flow(c, alice, flow_body())
    eid = (await c.post(f"/webhooks/{fid}", json={})).json()["data"]["executionId"]
    await finished(c, alice, eid)
    assert (await c.get(f"/executions/{eid}", headers=bob.headers)).status_code == 404
    assert (await c.get("/executions", headers=bob.headers)).json()["meta"]["total"] == 0
    assert (await c.get("/executions/nope", headers=bob.headers)).status_code == 400
    assert (await c.get("/logs", params={"filter[tenant]": t1}, headers=bob.headers)).status_code == 403
    assert (await c.get("/logs", headers=alice.headers)).status_code == 400
    assert (
        await c.get("/logs", params={"filter[tenant]": t1, "showErrors": "maybe"}, headers=alice.headers)
    ).status_code == 400
    assert (
        await c.get("/logs", params={"filter[tenant]": t1, "filter[nope]": "x"}, headers=alice.headers)
    ).status_code == 400
    counts = (await c.get("/icenter/executions", headers=bob.headers)).json()
    assert counts["data"] == [] and counts["metadata"]["totalExecutions"] == 0
    assert (await c.get("/icenter/executions")).status_code == 401
    for params in (
        {"groupby": "tenant"},
        {"start": "2026-13-01"},
        {"start": "2026-02-02", "end": "2026-02-01"},
        {"end": "yesterday"},
    ):
        assert (await c.get("/icenter/executions", params=params, headers=alice.headers)).status_code == 400


async def test_pruning_keeps_counts(engine_client: Client, admin: Account, db: Database) -> None:
    c = engine_client
    fid = await active_flow(c, admin, flow_body())
    ids = [(await c.post(f"/webhooks/{fid}", json={"i": i})).json()["data"]["executionId"] for i in range(3)]
    for eid in ids:
        await finished(c, admin, eid)
    before = (await c.get("/icenter/executions", params={"groupby": "flow"}, headers=admin.headers)).json()
    counts = await pruner.prune(
        db, retention=timedelta(seconds=0), batch=2, now=utcnow() + timedelta(seconds=2)
    )
    assert counts["executions"] == 3 and counts["logs"] > 0
    async with db.read() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Execution)) == 0
    after = (await c.get("/icenter/executions", params={"groupby": "flow"}, headers=admin.headers)).json()
    assert after == before and after["metadata"]["totalExecutions"] == 3


async def test_a_move_that_keeps_failing_is_bounded(
    client: Client, admin: Account, db: Database, registry: Any, app: Any
) -> None:
    """A flow whose start crashes (here: a corrupt graph) does not stay in 'starting'."""
    fid = (await client.post("/flows", json=flow_body(), headers=admin.headers)).json()["data"]["id"]
    await client.post(f"/flows/{fid}/start", headers=admin.headers)
    async with db.write() as session:
        await session.execute(sa.update(Flow).where(Flow.id == fid).values(graph={"nodes": "corrupt"}))
    box = app.state.secret_box
    assert await lifecycle.reconcile(db, registry, box, stop_grace=30, bound=3600) == 0
    assert (await client.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]["status"] == "starting"
    assert await lifecycle.reconcile(db, registry, box, stop_grace=30, bound=0) == 1
    flow = (await client.get(f"/flows/{fid}", headers=admin.headers)).json()["data"]
    assert flow["status"] == "inactive" and flow["statusMessage"].startswith("starting failed for 0 s")
