"""The ``flow`` component (SPEC §12): a sub-flow runs as an execution of its own (trigger
``flow``, ``parentExecutionId``) while its parent waits parked; depth limit; cycles refused on
save; the child's visibility checked on save and again when the step runs, with one answer
that says nothing of another tenant's flows. SQLite and PostgreSQL, in-process engine."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Account, Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow, finished

Client = httpx.AsyncClient
UNKNOWN = "0123456789abcdef01234567"


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    return engine_settings.model_copy(update={"resume_poll_seconds": 0.2, "flow_max_depth": 2})


def _refusal(flow_id: str) -> str:
    return f"flow {flow_id} is not a flow of this tenant that this flow's owners can see"


def _graph(*nodes: dict[str, Any]) -> dict[str, Any]:
    chain = [{"id": "in", "componentId": "webhook"}, *nodes]
    return {
        "nodes": chain,
        "edges": [{"source": a["id"], "target": b["id"]} for a, b in itertools.pairwise(chain)],
    }


def _expr(nid: str, expression: str) -> dict[str, Any]:
    return {"id": nid, "componentId": "jsonata", "fields": {"expression": expression}}


def _call(flow_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": "call", "componentId": "flow", "fields": {"flowId": flow_id, **fields}}


async def _create(c: Client, who: Account, *nodes: dict[str, Any], **extra: Any) -> str:
    r = await c.post("/flows", json=flow_body(graph=_graph(*nodes), **extra), headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


async def _run(c: Client, who: Account, fid: str, data: Any) -> dict[str, Any]:
    r = await c.post(f"/webhooks/{fid}", json=data)
    assert r.status_code == 202, r.text
    return await finished(c, who, r.json()["data"]["executionId"])


async def _children(c: Client, who: Account, fid: str) -> list[dict[str, Any]]:
    r = await c.get("/executions", params={"filter[flowId]": fid}, headers=who.headers)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


async def _member(factory: Factory) -> Account:
    return await factory.user(tenant=await factory.tenant())


async def test_a_sub_flow_runs_as_its_own_execution(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await _member(factory)
    child = await _create(c, member, _expr("double", "{'twice': n * 2}"))  # never started: it is called
    parent = await active_flow(
        c, member, flow_body(graph=_graph(_call(child), _expr("out", "{'got': twice}")))
    )
    e = await _run(c, member, parent, {"n": 21})
    assert e["status"] == "succeeded", e
    assert e["result"] == {"data": {"got": 42}}
    (run,) = await _children(c, member, child)
    assert run["trigger"] == "flow" and run["parentExecutionId"] == e["id"]
    assert run["status"] == "succeeded" and run["result"] == {"data": {"twice": 42}}
    call = next(s for s in e["steps"] if s["nodeId"] == "call")
    assert call["status"] == "succeeded" and call["runs"] == 1


async def test_a_poison_item_fails_alone(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await _member(factory)
    child = await _create(c, member, _expr("double", "n * 2"))
    parent = await active_flow(c, member, flow_body(graph=_graph(_call(child))))
    sent = []
    for data in ({"n": 1}, {"n": "poison"}, {"n": 3}):
        r = await c.post(f"/webhooks/{parent}", json=data)
        sent.append(r.json()["data"]["executionId"])
    runs = [await finished(c, member, eid) for eid in sent]
    assert [r["status"] for r in runs] == ["succeeded", "failed", "succeeded"]
    assert runs[0]["result"] == {"data": 2} and runs[2]["result"] == {"data": 6}
    assert runs[1]["error"].startswith("step call failed: flow: sub-flow execution ")
    assert " failed: step double failed: " in runs[1]["error"]


async def test_depth_is_limited(engine_client: Client, factory: Factory) -> None:
    """FLOWYARD_FLOW_MAX_DEPTH is 2 here: a → b → c runs, a → b → c → d does not."""
    c = engine_client
    member = await _member(factory)
    d = await _create(c, member, _expr("x", "'d'"))
    cc = await _create(c, member, _call(d))
    b = await _create(c, member, _call(cc))
    a = await active_flow(c, member, flow_body(graph=_graph(_call(b))))
    e = await _run(c, member, a, {"n": 1})
    assert e["status"] == "failed"
    assert "the sub-flow depth limit (2, FLOWYARD_FLOW_MAX_DEPTH) is reached" in e["error"], e
    assert f"{a} → {b} → {cc} → {d}" in e["error"]
    assert await _children(c, member, d) == []
    b2 = await active_flow(c, member, flow_body(graph=_graph(_call(d))))
    e2 = await _run(c, member, await active_flow(c, member, flow_body(graph=_graph(_call(b2)))), {})
    assert e2["status"] == "succeeded" and e2["result"] == {"data": "d"}, e2


async def test_a_cycle_is_refused_on_save(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await _member(factory)
    a = await _create(c, member, _expr("x", "1"))
    b = await _create(c, member, _call(a))
    cc = await _create(c, member, _call(b))
    r = await c.patch(f"/flows/{a}", json={"graph": _graph(_call(cc))}, headers=member.headers)
    assert r.status_code == 400, r.text
    cycle = f"{a} → {cc} → {b} → {a}"
    assert r.json()["errors"] == [
        {
            "message": f"graph.nodes[1].fields.flowId: flows calling each other form a cycle: {cycle}",
            "code": 400,
            "field": "graph.nodes[1].fields.flowId",
        }
    ]
    r = await c.patch(f"/flows/{a}", json={"graph": _graph(_call(a))}, headers=member.headers)
    assert r.status_code == 400 and "form a cycle: " + f"{a} → {a}" in r.text, r.text


async def test_fields_and_unseen_flows_are_refused_on_save(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await _member(factory)
    stranger = await _member(factory)  # a member of another tenant
    loner = await factory.user()  # no tenant
    theirs = await _create(c, stranger, _expr("x", "1"))
    lonely = await _create(c, loner, _expr("x", "1"))
    for who, target in (
        (member, theirs),
        (member, UNKNOWN),
        (member, lonely),
        (loner, theirs),
        (stranger, lonely),
    ):
        r = await c.post("/flows", json=flow_body(graph=_graph(_call(target))), headers=who.headers)
        assert r.status_code == 400, r.text
        assert r.json()["errors"] == [
            {
                "message": f"graph.nodes[1].fields.flowId: {_refusal(target)} (node 'call')",
                "code": 400,
                "field": "graph.nodes[1].fields.flowId",
            }
        ]
    r = await c.post("/flows", json=flow_body(graph=_graph(_call("nope", timeout=0))), headers=member.headers)
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {
        "graph.nodes[1].fields.flowId",
        "graph.nodes[1].fields.timeout",
    }


async def test_visibility_is_checked_again_when_the_step_runs(
    engine_client: Client, factory: Factory, admin: Account
) -> None:
    c = engine_client
    member = await _member(factory)
    other_tenant = await factory.tenant()
    gone = await _create(c, member, _expr("x", "1"))
    moved = await _create(c, member, _expr("x", "1"))
    hidden = await _create(c, member, _expr("x", "1"))
    parents = {
        child: await active_flow(c, member, flow_body(graph=_graph(_call(child))))
        for child in (gone, moved, hidden)
    }
    assert (await c.delete(f"/flows/{gone}", headers=member.headers)).status_code in (200, 204)
    r = await c.patch(
        f"/flows/{moved}",
        json={"tenant": other_tenant, "owners": [{"type": "tenant", "id": other_tenant}]},
        headers=admin.headers,
    )
    assert r.status_code == 200, r.text
    r = await c.patch(
        f"/flows/{hidden}",
        json={"owners": [{"type": "user", "id": admin.id}], "tenant": None},
        headers=admin.headers,
    )
    assert r.status_code == 200, r.text
    for child, parent in parents.items():
        e = await _run(c, member, parent, {"n": 1})
        assert e["status"] == "failed", e
        assert e["error"] == f"step call failed: flow: {_refusal(child)}", e
        assert await _children(c, admin, child) == []


async def test_another_tenant_cannot_see_a_child_execution(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await _member(factory)
    stranger = await _member(factory)
    child = await _create(c, member, _expr("x", "n"))
    parent = await active_flow(c, member, flow_body(graph=_graph(_call(child))))
    e = await _run(c, member, parent, {"n": 5})
    (run,) = await _children(c, member, child)
    for who in (stranger, await factory.user()):
        assert (await c.get(f"/executions/{run['id']}", headers=who.headers)).status_code == 404
        assert (await c.get(f"/executions/{e['id']}", headers=who.headers)).status_code == 404
        assert await _children(c, who, child) == []


async def test_a_cancelled_child_fails_the_step_without_waiting_for_the_timeout(
    engine_client: Client, factory: Factory
) -> None:
    c = engine_client
    member = await _member(factory)
    child = await _create(c, member, {"id": "d", "componentId": "delay", "fields": {"seconds": 60}})
    parent = await active_flow(c, member, flow_body(graph=_graph(_call(child, timeout=120))))
    r = await c.post(f"/webhooks/{parent}", json={"n": 1})
    eid = r.json()["data"]["executionId"]

    async def child_waits() -> str | None:
        runs = await _children(c, member, child)
        return str(runs[0]["id"]) if runs and runs[0]["status"] == "waiting" else None

    run = await wait_until(child_waits)
    assert (await c.post(f"/executions/{run}/cancel", headers=member.headers)).status_code == 200
    e = await finished(c, member, eid)
    assert e["status"] == "failed", e
    assert e["error"].startswith(f"step call failed: flow: sub-flow execution {run} cancelled: "), e
