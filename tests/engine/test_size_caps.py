"""Issue 17 (SPEC §6): what a step produces is capped where the runner checks it, so an
execution's result, its ?wait= reply to an anonymous caller, its log entries and the messages
in flight stay under their settings, and an over-cap step fails with an error naming the cap.
Small caps here (the defaults are 1 MiB and 8 MiB), real runner processes."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_engine_e2e import active_flow, finished

RESULT_CAP = 64 * 1024
OUTPUT_CAP = 256 * 1024
BIG = {"blob": "x" * 100_000}  # over the result cap, under the output cap and the body limit


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    return engine_settings.model_copy(update={"max_result_bytes": RESULT_CAP, "max_output_bytes": OUTPUT_CAP})


def _graph(*nodes: dict[str, Any]) -> dict[str, Any]:
    ids = ["in", *(n["id"] for n in nodes)]
    return flow_body(
        graph={
            "nodes": [{"id": "in", "componentId": "webhook"}, *nodes],
            "edges": [{"source": a, "target": b} for a, b in itertools.pairwise(ids)],
        }
    )


async def _run(
    c: httpx.AsyncClient, who: Account, body: dict[str, Any], payload: Any
) -> tuple[httpx.Response, dict[str, Any]]:
    fid = await active_flow(c, who, body)
    r = await c.post(f"/webhooks/{fid}", params={"wait": 20}, json=payload)
    executions = await c.get("/executions", params={"filter[flowId]": fid}, headers=who.headers)
    (only,) = executions.json()["data"]
    return r, await finished(c, who, only["id"])


async def test_a_reply_over_the_cap_fails_its_step(engine_client: httpx.AsyncClient, admin: Account) -> None:
    body = _graph({"id": "reply", "componentId": "respond", "fields": {"status": 200}})
    r, e = await _run(engine_client, admin, body, BIG)
    assert r.status_code == 502 and "x" * 1000 not in r.text, r.status_code
    assert e["status"] == "failed" and e["result"] is None
    assert e["error"] == (
        "step reply failed: the body of its reply is 100011 bytes as JSON, "
        "over the 64 KiB limit (FLOWYARD_MAX_RESULT_BYTES)"
    )


async def test_a_result_over_the_cap_fails_the_last_step(
    engine_client: httpx.AsyncClient, admin: Account
) -> None:
    body = _graph({"id": "copy", "componentId": "jsonata", "fields": {"expression": "$"}})
    r, e = await _run(engine_client, admin, body, BIG)
    assert r.status_code == 502 and len(r.content) < 1000
    assert e["status"] == "failed" and e["result"] is None
    assert e["error"] == (
        "step copy failed: its output, the execution's result, is 100011 bytes as JSON, "
        "over the 64 KiB limit (FLOWYARD_MAX_RESULT_BYTES)"
    )


async def test_a_message_over_the_output_cap_fails_its_step(
    engine_client: httpx.AsyncClient, admin: Account
) -> None:
    body = _graph(
        {"id": "grow", "componentId": "jsonata", "fields": {"expression": "[$, $, $]"}},
        {"id": "small", "componentId": "jsonata", "fields": {"expression": "'ok'"}},
    )
    _r, e = await _run(engine_client, admin, body, BIG)
    assert e["status"] == "failed"
    assert e["error"].startswith("step grow failed: its output is ")
    assert e["error"].endswith(" bytes as JSON, over the 256 KiB limit (FLOWYARD_MAX_OUTPUT_BYTES)")


async def test_under_the_caps_and_log_data_cut_to_a_marker(
    engine_client: httpx.AsyncClient, factory: Factory
) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    body = _graph(
        {"id": "log", "componentId": "log", "fields": {"message": "big"}},
        {"id": "small", "componentId": "jsonata", "fields": {"expression": "{'n': $length(blob)}"}},
    )
    fid = await active_flow(engine_client, member, body)
    r = await engine_client.post(f"/webhooks/{fid}", params={"wait": 20}, json=BIG)
    assert r.status_code == 200 and r.json() == {"n": 100_000}, r.text
    logs = await engine_client.get(
        "/logs", params={"filter[tenant]": tenant, "filter[flowId]": fid}, headers=member.headers
    )
    (entry,) = [x for x in logs.json()["data"] if x["message"] == "big"]
    assert entry["data"] == {"truncated": True, "bytes": 100011, "limit": RESULT_CAP}


def test_default_caps() -> None:
    s = Settings()
    assert s.max_result_bytes == 1024 * 1024 and s.max_output_bytes == 8 * 1024 * 1024
    assert s.max_output_bytes > max(s.http_max_response_bytes, s.connector_max_result_bytes)
