"""Graph semantics of the runner, without a database: fan-out, fan-in,
conditions, mappers, split, respond, pass-through nodes and step errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from flowyard.clock import utcnow
from flowyard.components import builtins
from flowyard.components.netpolicy import build_client
from flowyard.components.registry import Component, Registry
from flowyard.config import Settings
from flowyard.queue.store import Claimed, Outcome
from flowyard.runtime.runner import CompiledFlow, FlowNotRunnable, run_execution


class _BoomFields(BaseModel):
    pass


async def _boom(message: Any, ctx: Any) -> Any:
    raise RuntimeError("kaboom")


async def _hang(message: Any, ctx: Any) -> Any:
    await asyncio.sleep(3600)


async def _bad_shape(message: Any, ctx: Any) -> Any:
    return 42


TEST_COMPONENTS = (
    Component(id="boom", description="raises", functions={"run": _boom}, default_function="run"),
    Component(id="hang", description="hangs", functions={"run": _hang}, default_function="run"),
    Component(id="bad", description="returns junk", functions={"run": _bad_shape}, default_function="run"),
)
REGISTRY = Registry({c.id: c for c in (*builtins.ALL, *TEST_COMPONENTS)})
SETTINGS = Settings(step_timeout=0.3, max_messages=100)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with build_client(SETTINGS) as client:
        yield client


def node(nid: str, component: str | None = None, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": nid}
    if component:
        out["componentId"] = component
    if fields:
        out["fields"] = fields
    return out


def edge(
    src: str, dst: str, condition: str | None = None, mapper: dict[str, Any] | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if condition:
        config["condition"] = condition
    if mapper is not None:
        config["mapper"] = mapper
    return {"source": src, "target": dst, **({"config": config} if config else {})}


async def run(
    http: httpx.AsyncClient,
    nodes: list[dict[str, Any]],
    edges: list[dict[str, Any]],
    data: Any,
    settings: Settings = SETTINGS,
    *,
    registry: Registry = REGISTRY,
    credentials: dict[str, dict[str, Any]] | None = None,
) -> Outcome:
    flow = CompiledFlow.compile(
        flow_id="f" * 24,
        version=1,
        tenant="t1",
        owner_user="u1",
        graph={"nodes": nodes, "edges": edges},
        registry=registry,
    )
    claimed = Claimed(
        id="e" * 24,
        flow_id="f" * 24,
        flow_version=1,
        tenant="t1",
        owner_user="u1",
        trigger="webhook",
        input=data,
        attempts=1,
        created_at=utcnow(),
        scheduled_for=None,
    )
    return await run_execution(flow, claimed, settings=settings, http=http, credentials=credentials)


def steps(outcome: Outcome) -> dict[str, Any]:
    return {s.node_id: s for s in outcome.steps}


async def test_pass_through_chain_returns_last_data(http: httpx.AsyncClient) -> None:
    out = await run(http, [node("a"), node("b")], [edge("a", "b")], {"x": 1})
    assert out.status == "succeeded"
    assert out.result == {"data": {"x": 1}}
    assert steps(out)["b"].messages_in == 1


async def test_fan_out_and_fan_in(http: httpx.AsyncClient) -> None:
    # a -> b, a -> c, b -> d, c -> d: d runs once per arriving message.
    nodes = [node("a"), node("b"), node("c"), node("d")]
    edges = [edge("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d")]
    out = await run(http, nodes, edges, {"v": 1})
    s = steps(out)
    assert s["b"].runs == 1 and s["c"].runs == 1
    assert s["d"].runs == 2 and s["d"].messages_out == 2


async def test_conditions_route_messages(http: httpx.AsyncClient) -> None:
    nodes = [node("in"), node("big"), node("small")]
    edges = [edge("in", "big", condition="amount > 100"), edge("in", "small", condition="amount <= 100")]
    out = await run(http, nodes, edges, {"amount": 250})
    assert set(steps(out)) == {"in", "big"}
    out = await run(http, nodes, edges, {"amount": 5})
    assert set(steps(out)) == {"in", "small"}


async def test_mapper_builds_target_data(http: httpx.AsyncClient) -> None:
    nodes = [node("in"), node("out")]
    edges = [
        edge(
            "in",
            "out",
            mapper={
                "id": "order.id",
                "total": "$sum(order.items.price)",
                "fixed": 7,
                "nested": {"first": "order.items[0].name"},
            },
        )
    ]
    data = {"order": {"id": "A1", "items": [{"name": "pen", "price": 2}, {"name": "ink", "price": 3}]}}
    out = await run(http, nodes, edges, data)
    assert out.result == {"data": {"id": "A1", "total": 5, "fixed": 7, "nested": {"first": "pen"}}}


async def test_mapper_that_yields_nothing_fails_clearly(http: httpx.AsyncClient) -> None:
    out = await run(
        http, [node("in"), node("out")], [edge("in", "out", mapper={"a": "missing.field"})], {"x": 1}
    )
    assert out.status == "failed"
    assert "mapper of edge in->out yielded nothing" in (out.error or "")


async def test_condition_that_throws_fails_the_execution(http: httpx.AsyncClient) -> None:
    out = await run(http, [node("in"), node("out")], [edge("in", "out", condition="$number('abc') > 1")], {})
    assert out.status == "failed"
    assert out.error and "edge in->out" in out.error


async def test_split_emits_one_message_per_element(http: httpx.AsyncClient) -> None:
    nodes = [
        node("in"),
        node("split", "split", expression="items"),
        node("each", "jsonata", expression="n * 2"),
    ]
    out = await run(
        http, nodes, [edge("in", "split"), edge("split", "each")], {"items": [{"n": 1}, {"n": 2}, {"n": 3}]}
    )
    s = steps(out)
    assert s["split"].messages_out == 3
    assert s["each"].runs == 3
    assert s["each"].output == [2, 4, 6]


async def test_split_over_the_message_limit_is_refused_without_materialising(http: httpx.AsyncClient) -> None:
    nodes = [node("in"), node("split", "split", expression="items")]
    out = await run(http, nodes, [edge("in", "split")], {"items": list(range(1000))})
    assert out.status == "failed"
    assert "limit per execution is 100" in (out.error or "")


async def test_filter_drops_messages(http: httpx.AsyncClient) -> None:
    nodes = [node("in"), node("f", "filter", condition="ok = true"), node("out")]
    out = await run(http, nodes, [edge("in", "f"), edge("f", "out")], {"ok": False})
    assert out.status == "succeeded"
    assert "out" not in steps(out)


async def test_respond_sets_the_reply(http: httpx.AsyncClient) -> None:
    nodes = [node("in"), node("r", "respond", status=201, body="{'got': x}", headers={"X-A": "1"})]
    out = await run(http, nodes, [edge("in", "r")], {"x": 9})
    assert out.result == {"reply": {"status": 201, "body": {"got": 9}, "headers": {"X-A": "1"}}}


async def test_failing_component_names_step_component_and_error(http: httpx.AsyncClient) -> None:
    out = await run(http, [node("in"), node("explode", "boom")], [edge("in", "explode")], {})
    assert out.status == "failed"
    assert out.error == "step explode failed: RuntimeError: kaboom"
    errors = [entry for entry in out.logs if entry["level"] == "error"]
    assert len(errors) == 1
    assert errors[0]["step_id"] == "explode" and errors[0]["component_id"] == "boom"
    assert "kaboom" in errors[0]["message"]
    assert steps(out)["explode"].status == "failed"
    assert steps(out)["in"].status == "succeeded"


async def test_hanging_component_times_out(http: httpx.AsyncClient) -> None:
    out = await run(http, [node("in"), node("h", "hang")], [edge("in", "h")], {})
    assert out.status == "failed"
    assert "timed out after 0.3 s" in (out.error or "")


async def test_component_returning_junk_fails(http: httpx.AsyncClient) -> None:
    out = await run(http, [node("in"), node("b", "bad")], [edge("in", "b")], {})
    assert out.status == "failed" and "shaped {data, metadata}" in (out.error or "")


async def test_every_step_writes_a_log_entry(http: httpx.AsyncClient) -> None:
    out = await run(http, [node("in"), node("l", "log", message="hello")], [edge("in", "l")], {"a": 1})
    by_step: dict[str, list[str]] = {}
    for entry in out.logs:
        by_step.setdefault(entry["step_id"], []).append(entry["message"])
    assert set(by_step) == {"in", "l"}
    assert "hello" in by_step["l"]
    assert any("ran 1 time(s)" in m for m in by_step["in"])


async def test_message_budget_bounds_fan_out(http: httpx.AsyncClient) -> None:
    # Each of 20 nodes fans out to the next layer: 2^k growth is cut at the budget.
    nodes = [node(f"n{i}") for i in range(12)]
    edges = [edge(f"n{i}", f"n{j}") for i in range(12) for j in range(i + 1, 12)]
    out = await run(http, nodes, edges, {})
    assert out.status == "failed" and "exceeded 100 messages" in (out.error or "")


async def test_missing_component_makes_flow_not_runnable() -> None:
    with pytest.raises(FlowNotRunnable, match="not installed"):
        CompiledFlow.compile(
            flow_id="f" * 24,
            version=1,
            tenant=None,
            owner_user=None,
            graph={"nodes": [node("a", "nope")], "edges": []},
            registry=REGISTRY,
        )


async def test_http_component_refuses_metadata_address(http: httpx.AsyncClient) -> None:
    nodes = [node("in"), node("h", "http", url="http://169.254.169.254/latest/meta-data/")]
    out = await run(http, nodes, [edge("in", "h")], {})
    assert out.status == "failed"
    assert "169.254.169.254 (cloud metadata" in (out.error or "")
