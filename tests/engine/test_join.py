"""The ``join`` component (SPEC §12): a set per incoming edge (or ``fields.count`` messages),
emitted in edge order; an incomplete set parks the execution (it holds nothing) and fails the
step at ``fields.timeout``; fields are checked on save. SQLite and PostgreSQL, in-process engine
(across a SIGKILL of every process: tests/engine/test_subflow_durability.py)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Account, Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow, finished

Client = httpx.AsyncClient


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    return engine_settings.model_copy(update={"resume_poll_seconds": 0.2})


def _expr(nid: str, expression: str) -> dict[str, Any]:
    return {"id": nid, "componentId": "jsonata", "fields": {"expression": expression}}


def _join(**fields: Any) -> dict[str, Any]:
    return {"id": "j", "componentId": "join", "fields": fields}


def _body(nodes: list[dict[str, Any]], edges: list[tuple[str, str]]) -> dict[str, Any]:
    return flow_body(
        graph={
            "nodes": [{"id": "in", "componentId": "webhook"}, *nodes],
            "edges": [{"source": a, "target": b} for a, b in edges],
        }
    )


async def _run(c: Client, who: Account, fid: str, data: Any) -> dict[str, Any]:
    r = await c.post(f"/webhooks/{fid}", json=data)
    assert r.status_code == 202, r.text
    return await finished(c, who, r.json()["data"]["executionId"])


def _step(e: dict[str, Any], node: str) -> dict[str, Any]:
    return next(s for s in e["steps"] if s["nodeId"] == node)


async def test_join_emits_one_list_in_edge_order(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    # a runs first (its edge from `in` comes first), but b -> j is j's first incoming edge.
    body = _body(
        [_expr("a", "'A' & n"), _expr("b", "'B' & n"), _join(), {"id": "out", "componentId": "log"}],
        [("in", "a"), ("in", "b"), ("b", "j"), ("a", "j"), ("j", "out")],
    )
    fid = await active_flow(c, member, body)
    e = await _run(c, member, fid, {"n": 1})
    assert e["status"] == "succeeded", e
    assert e["result"] == {"data": ["B1", "A1"]}
    j = _step(e, "j")
    assert j["messagesIn"] == 2 and j["runs"] == 1 and j["messagesOut"] == 1


async def test_join_with_count_gathers_that_many(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    split = {"id": "s", "componentId": "split", "fields": {"expression": "items"}}
    fid = await active_flow(c, member, _body([split, _join(count=2)], [("in", "s"), ("s", "j")]))
    e = await _run(c, member, fid, {"items": [1, 2, 3, 4]})
    assert e["status"] == "succeeded", e
    j = _step(e, "j")
    assert j["runs"] == 2 and j["output"] == [[1, 2], [3, 4]]
    assert e["result"] == {"data": [3, 4]}


async def test_an_incomplete_join_parks_then_times_out(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    drop = {"id": "f", "componentId": "filter", "fields": {"condition": "false"}}
    fid = await active_flow(
        c,
        member,
        _body(
            [_expr("a", "n"), drop, _join(timeout=1.5)], [("in", "a"), ("in", "f"), ("a", "j"), ("f", "j")]
        ),
    )
    sent = time.monotonic()
    r = await c.post(f"/webhooks/{fid}", json={"n": 1})
    eid = r.json()["data"]["executionId"]

    async def waiting() -> dict[str, Any] | None:
        e = (await c.get(f"/executions/{eid}", headers=member.headers)).json()["data"]
        assert e["status"] in ("queued", "running", "waiting"), e
        return e if e["status"] == "waiting" else None

    w = await wait_until(waiting)
    assert w["resumeAt"] is not None and _step(w, "j")["status"] == "waiting"
    e = await finished(c, member, eid)
    assert time.monotonic() - sent >= 1.5
    assert e["status"] == "failed", e
    assert e["error"] == "step j failed: join timed out after 1.5 s: no message came from incoming edge(s) 2"
    assert _step(e, "j")["status"] == "failed"


async def test_a_timed_out_join_takes_its_failure_edge(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    drop = {"id": "f", "componentId": "filter", "fields": {"condition": "false"}}
    body = _body(
        [_expr("a", "n"), drop, _join(timeout=0.5), _expr("late", "error.message")],
        [("in", "a"), ("in", "f"), ("a", "j"), ("f", "j")],
    )
    body["graph"]["edges"].append({"source": "j", "target": "late", "on": "failure"})
    fid = await active_flow(c, member, body)
    e = await _run(c, member, fid, {"n": 5})
    assert e["status"] == "succeeded", e
    assert e["result"] == {"data": "join timed out after 0.5 s: no message came from incoming edge(s) 2"}


async def test_join_fields_are_checked_on_save(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    for fields, message in (
        ({"count": 0}, "greater than or equal to 1"),
        ({"count": 1.5}, "valid integer"),
        ({"count": True}, "valid integer"),
        ({"timeout": 0}, "greater than 0"),
        ({"timeout": 10**9}, "less than or equal to 604800"),
        ({"timeout": "5"}, "must be a number of seconds"),
        ({"other": 1}, "Extra inputs"),
    ):
        body = _body([_expr("a", "n"), _join(**fields)], [("in", "a"), ("a", "j")])
        r = await c.post("/flows", json=body, headers=member.headers)
        assert r.status_code == 400, r.text
        err = r.json()["errors"][0]
        assert err["field"].startswith("graph.nodes[2].fields."), err
        assert message in err["message"] and "(node 'j')" in err["message"], err
    body = _body([_join()], [])
    body["graph"]["nodes"].append(_expr("a", "n"))
    body["graph"]["edges"] = [{"source": "in", "target": "a"}]
    r = await c.post("/flows", json=body, headers=member.headers)
    assert r.status_code == 400, r.text
    assert r.json()["errors"] == [
        {
            "message": "graph.nodes[1]: a join needs at least one incoming edge (node 'j')",
            "code": 400,
            "field": "graph.nodes[1]",
        }
    ]


async def test_a_poison_item_fails_alone(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    body = _body(
        [_expr("a", "n * 2"), _expr("b", "'x'"), _join()], [("in", "a"), ("in", "b"), ("a", "j"), ("b", "j")]
    )
    fid = await active_flow(c, member, body)
    sent = []
    for data in ({"n": 1}, {"n": "poison"}, {"n": 3}):
        r = await c.post(f"/webhooks/{fid}", json=data)
        sent.append(r.json()["data"]["executionId"])
    runs = [await finished(c, member, eid) for eid in sent]
    assert [r["status"] for r in runs] == ["succeeded", "failed", "succeeded"]
    assert runs[0]["result"] == {"data": [2, "x"]} and runs[2]["result"] == {"data": [6, "x"]}
    assert runs[1]["error"].startswith("step a failed: ")


async def test_components_lists_join_and_flow_with_their_fields(
    engine_client: Client, factory: Factory
) -> None:
    member = await factory.user(tenant=await factory.tenant())
    r = await engine_client.get("/components", headers=member.headers)
    assert r.status_code == 200
    found = {c["id"]: c for c in r.json()["data"]}
    join, flow = found["join"]["fields"], found["flow"]["fields"]
    assert set(join["properties"]) == {"count", "timeout"} and join["additionalProperties"] is False
    assert flow["required"] == ["flowId"] and set(flow["properties"]) == {"flowId", "timeout"}
