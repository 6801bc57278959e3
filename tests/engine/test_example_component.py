"""The worked example under examples/ is a real component: its entry point
names it, and a flow using it validates and runs."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import httpx

from flowyard.clock import utcnow
from flowyard.components import builtins
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.flows.validation import validate_flow_body
from flowyard.queue.store import Claimed
from flowyard.runtime.runner import CompiledFlow, run_execution

EXAMPLE = Path(__file__).parents[2] / "examples" / "flowyard-uppercase"


def _load() -> object:
    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        import flowyard_uppercase

        return flowyard_uppercase.COMPONENT
    finally:
        sys.path.remove(str(EXAMPLE / "src"))


async def test_example_component_declares_and_runs() -> None:
    entry = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry["flowyard.components"] == {"uppercase": "flowyard_uppercase:COMPONENT"}
    component = _load()
    registry = Registry({c.id: c for c in (*builtins.ALL, component)})  # type: ignore[attr-defined]
    graph = {
        "nodes": [
            {"id": "in"},
            {"id": "up", "componentId": "uppercase", "fields": {"keys": ["name"]}},
            {"id": "n", "componentId": "uppercase", "function": "count"},
        ],
        "edges": [{"source": "in", "target": "up"}, {"source": "up", "target": "n"}],
    }
    _clean, problems = validate_flow_body(
        {"name": "x", "type": "ordinary", "graph": graph}, registry=registry
    )
    assert problems == []
    _clean, problems = validate_flow_body(
        {
            "name": "x",
            "type": "ordinary",
            "graph": {"nodes": [{"id": "a", "componentId": "uppercase", "fields": {"keys": "name"}}]},
        },
        registry=registry,
    )
    assert [p.field for p in problems] == ["graph.nodes[0].fields.keys"]
    flow = CompiledFlow.compile(
        flow_id="f" * 24, version=1, tenant=None, owner_user=None, graph=graph, registry=registry
    )
    claimed = Claimed(
        id="e" * 24,
        flow_id="f" * 24,
        flow_version=1,
        tenant=None,
        owner_user=None,
        trigger="manual",
        input={"name": "ada", "city": "london"},
        attempts=1,
        created_at=utcnow(),
        scheduled_for=None,
    )
    async with httpx.AsyncClient() as http:
        out = await run_execution(flow, claimed, settings=Settings(), http=http)
    assert out.status == "succeeded"
    steps = {s.node_id: s for s in out.steps}
    assert steps["up"].output == [{"name": "ADA", "city": "london"}]
    assert steps["n"].messages_out == 2
