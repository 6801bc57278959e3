"""Editing an active flow (SPEC §3 as extended in docs/api.md), on SQLite and PostgreSQL.

A PATCH (or a restore) of an ``active`` flow applies to executions accepted afterwards; one
accepted before it (running, waiting, queued) goes on with the version it was accepted with.
The flow stays active throughout. Its event trigger (the subscription made when it started)
cannot change while it is active; its schedule can, and fires by the new one. ``starting`` and
``stopping`` refuse every change. And the attacks: another tenant's member, a read-only token
and a tenantless user change nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from tests.api.test_flows import World, assert_error, make_world, set_status
from tests.conftest import Account, Factory, flow_body, wait_until

SLOW = {
    "nodes": [
        {"id": "in", "componentId": "webhook", "function": "receive"},
        # Over a second: the execution parks (waiting) and resumes by the version it names.
        {"id": "wait", "componentId": "delay", "fields": {"seconds": 2}},
        {"id": "out", "componentId": "log", "fields": {"level": "info"}},
    ],
    "edges": [{"source": "in", "target": "wait"}, {"source": "wait", "target": "out"}],
}
QUICK = {
    "nodes": [
        {"id": "in", "componentId": "webhook", "function": "receive"},
        {"id": "second", "componentId": "log", "fields": {"level": "warn"}},
    ],
    "edges": [{"source": "in", "target": "second"}],
}


@pytest.fixture
async def world(factory: Factory, admin: Account) -> World:
    return await make_world(factory, admin)


def _mqtt_graph(topic: str) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "in", "componentId": "mqtt", "function": "subscribe", "fields": {"filter": topic}},
            {"id": "out", "componentId": "log", "fields": {"level": "info"}},
        ],
        "edges": [{"source": "in", "target": "out"}],
    }


async def _create(c: httpx.AsyncClient, who: Account, **extra: Any) -> dict[str, Any]:
    r = await c.post("/flows", json=flow_body(**extra), headers=who.headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


async def _flow(c: httpx.AsyncClient, who: Account, fid: str) -> dict[str, Any]:
    r = await c.get(f"/flows/{fid}", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


async def _start(c: httpx.AsyncClient, who: Account, fid: str) -> None:
    assert (await c.post(f"/flows/{fid}/start", headers=who.headers)).status_code == 200

    async def active() -> bool:
        return (await _flow(c, who, fid))["status"] == "active"

    await wait_until(active, within=60)


async def _done(c: httpx.AsyncClient, who: Account, eid: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        e = (await c.get(f"/executions/{eid}", headers=who.headers)).json()["data"]
        return e if e["status"] in ("succeeded", "failed", "cancelled") else None

    return await wait_until(done, within=60)  # type: ignore[no-any-return]


async def test_an_edit_applies_to_executions_accepted_after_it(
    engine_client: httpx.AsyncClient, admin: Account
) -> None:
    c = engine_client
    fid = (await _create(c, admin, graph=SLOW))["id"]
    await _start(c, admin, fid)
    r = await c.post(f"/webhooks/{fid}", json={"n": 1})
    assert r.status_code == 202, r.text
    before = r.json()["data"]["executionId"]

    async def waiting() -> bool:
        e = (await c.get(f"/executions/{before}", headers=admin.headers)).json()["data"]
        return bool(e["status"] == "waiting")

    await wait_until(waiting, within=60)
    r = await c.patch(f"/flows/{fid}", json={"graph": QUICK}, headers=admin.headers)
    assert r.status_code == 200, r.text
    edited = r.json()["data"]
    assert edited["status"] == "active" and edited["version"] == 2 and edited["graph"] == QUICK
    r = await c.post(f"/webhooks/{fid}", json={"n": 2})
    assert r.status_code == 202, r.text
    after = r.json()["data"]["executionId"]

    ran_after = await _done(c, admin, after)
    ran_before = await _done(c, admin, before)
    assert (ran_after["status"], ran_after["flowVersion"]) == ("succeeded", 2)
    assert [s["nodeId"] for s in ran_after["steps"]] == ["in", "second"]
    assert (ran_before["status"], ran_before["flowVersion"]) == ("succeeded", 1)
    assert [s["nodeId"] for s in ran_before["steps"]] == ["in", "wait", "out"]
    assert (await _flow(c, admin, fid))["status"] == "active"
    versions = (await c.get(f"/flows/{fid}/versions", headers=admin.headers)).json()["data"]
    assert [v["version"] for v in versions] == [2, 1]

    # Restoring version 1 on the active flow is the same kind of change.
    r = await c.post(f"/flows/{fid}/versions/1/restore", headers=admin.headers)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["status"] == "active" and r.json()["data"]["graph"] == SLOW
    r = await c.post(f"/webhooks/{fid}", json={"n": 3})
    assert r.status_code == 202, r.text
    third = await _done(c, admin, r.json()["data"]["executionId"])
    assert (third["status"], third["flowVersion"]) == ("succeeded", 3)
    assert [s["nodeId"] for s in third["steps"]] == ["in", "wait", "out"]


async def test_a_new_schedule_fires_by_itself_and_a_removed_one_fires_no_more(
    engine_client: httpx.AsyncClient, admin: Account, db: Database
) -> None:
    c = engine_client
    yearly = "0 0 1 1 *"
    fid = (await _create(c, admin, cron=yearly))["id"]
    await _start(c, admin, fid)
    async with db.read() as session:
        first_next = await session.scalar(sa.select(Flow.next_run_at).where(Flow.id == fid))
    assert first_next is not None and first_next - utcnow() > timedelta(hours=1)

    r = await c.patch(f"/flows/{fid}", json={"cron": "* * * * * *"}, headers=admin.headers)
    assert r.status_code == 200, r.text

    async def fired() -> list[dict[str, Any]]:
        r = await c.get(f"/executions?filter[flowId]={fid}", headers=admin.headers)
        return [e for e in r.json()["data"] if e["trigger"] == "cron"]

    ran = await wait_until(fired, within=30)
    assert ran[0]["flowVersion"] == 2
    # A scheduled flow takes no webhooks; once its schedule is removed it does, and fires no more.
    assert (await c.post(f"/webhooks/{fid}", json={})).status_code == 409
    r = await c.patch(f"/flows/{fid}", json={"cron": None}, headers=admin.headers)
    assert r.status_code == 200, r.text
    async with db.read() as session:
        assert await session.scalar(sa.select(Flow.next_run_at).where(Flow.id == fid)) is None
    assert (await c.post(f"/webhooks/{fid}", json={})).status_code == 202
    assert (await _flow(c, admin, fid))["status"] == "active"


async def test_an_active_flows_event_trigger_stays_as_it_started(
    client: httpx.AsyncClient,
    world: World,
    db: Database,
) -> None:
    """The subscription is made at start: its node, connector, function, fields and credentials
    cannot change while the flow is active, nor can one be added or removed. Everything after
    the trigger can. Nothing is written by a refused change."""
    r = await client.post(
        "/flows", json=flow_body(graph=_mqtt_graph("orders/+")), headers=world.alice.headers
    )
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    url = f"/flows/{fid}"
    await set_status(db, fid, "active")  # no broker needed: the rule is the service's
    message = "The event trigger of an active flow cannot change"
    refused = [
        _mqtt_graph("invoices/+"),  # its fields
        {
            **_mqtt_graph("orders/+"),
            "nodes": [  # its node id
                {
                    "id": "in2",
                    "componentId": "mqtt",
                    "function": "subscribe",
                    "fields": {"filter": "orders/+"},
                },
                {"id": "out", "componentId": "log", "fields": {"level": "info"}},
            ],
            "edges": [{"source": "in2", "target": "out"}],
        },
        flow_body()["graph"],  # removed (a webhook flow now)
    ]
    for graph in refused:
        r = await client.patch(url, json={"graph": graph}, headers=world.alice.headers)
        errors = assert_error(r, 409)
        assert errors[0]["message"].startswith(message), errors
    stored = await _flow(client, world.alice, fid)
    assert stored["graph"] == _mqtt_graph("orders/+") and stored["version"] == 1
    kept = _mqtt_graph("orders/+")
    kept["nodes"][1]["fields"] = {"level": "warn"}
    r = await client.patch(url, json={"graph": kept, "name": "Orders"}, headers=world.alice.headers)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["graph"] == kept and r.json()["data"]["status"] == "active"

    # A webhook flow that is active cannot gain an event trigger either.
    webhook = await _create(client, world.alice)
    await set_status(db, webhook["id"], "active")
    r = await client.patch(
        f"/flows/{webhook['id']}", json={"graph": _mqtt_graph("x/+")}, headers=world.alice.headers
    )
    assert_error(r, 409)
    assert (await _flow(client, world.alice, webhook["id"]))["graph"] == flow_body()["graph"]


async def test_in_transit_flows_refuse_every_change(
    client: httpx.AsyncClient,
    world: World,
    db: Database,
) -> None:
    fid = (await _create(client, world.alice))["id"]
    for status in ("starting", "stopping"):
        await set_status(db, fid, status)
        for r in (
            await client.patch(f"/flows/{fid}", json={"graph": QUICK}, headers=world.alice.headers),
            await client.post(f"/flows/{fid}/versions/1/restore", headers=world.alice.headers),
        ):
            assert_error(r, 409, f"Flow is neither inactive nor active. Current status: {status}")
    assert (await _flow(client, world.alice, fid))["graph"] == flow_body()["graph"]


async def test_no_stranger_edits_an_active_flow(
    client: httpx.AsyncClient,
    world: World,
    db: Database,
    factory: Factory,
) -> None:
    fid = (await _create(client, world.alice))["id"]
    await set_status(db, fid, "active")
    loner = await factory.user()  # no tenant
    url = f"/flows/{fid}"
    body = {"graph": QUICK}
    assert_error(await client.patch(url, json=body, headers=world.bob.headers), 404)
    assert_error(await client.patch(url, json=body, headers=loner.headers), 404)
    assert_error(await client.patch(url, json=body, headers=world.reader.headers), 403)
    assert_error(await client.patch(url, json=body, headers=world.nobody.headers), 403)
    assert_error(await client.patch(url, json=body), 401)
    stored = await _flow(client, world.alice, fid)
    assert stored["graph"] == flow_body()["graph"] and stored["version"] == 1
    # An invalid graph is refused on an active flow as on an inactive one, nothing written.
    bad = {"nodes": [{"id": "in", "componentId": "no-such-component"}], "edges": []}
    assert_error(await client.patch(url, json={"graph": bad}, headers=world.alice.headers), 400)
    assert (await _flow(client, world.alice, fid))["version"] == 1
