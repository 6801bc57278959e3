"""Issue 15's JSON value rules end to end, on SQLite and PostgreSQL: every body the API accepts
as JSON is stored, read back and run as it was parsed (scalars at the top level, -0, big
numbers, escapes, NUL, empty containers, exactly the maximum depth); what nests deeper than
``jsonvalue.MAX_DEPTH`` is refused at the door with a 400, and a step whose output nests deeper
fails alone. After each, the queue goes on: a normal webhook to another flow completes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import sqlalchemy as sa

from flowyard.db.session import Database
from flowyard.jsonvalue import MAX_DEPTH
from flowyard.queue.models import Execution
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_engine_e2e import active_flow, finished

Client = httpx.AsyncClient
JSON = {"Content-Type": "application/json"}
FINISHED = ("succeeded", "failed", "cancelled")


def passing_flow(name: str) -> dict[str, Any]:
    """in (webhook) -> out (log, with the data): the result is {"data": <the input>}."""
    return flow_body(
        name=name,
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "out", "componentId": "log", "fields": {"includeData": True}},
            ],
            "edges": [{"source": "in", "target": "out"}],
        },
    )


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    return b"[" * depth + leaf + b"]" * depth


def canonical(value: Any) -> bytes:
    """The text a value is stored and served as: tells 1 from 1.0 and 0.0 from -0.0."""
    return orjson.dumps(value)


async def post_webhook(c: Client, fid: str, raw: bytes) -> httpx.Response:
    return await c.post(f"/webhooks/{fid}", content=raw, headers=JSON)


async def still_flows(c: Client, who: Account, fid: str) -> None:
    """A normal webhook to another flow completes (the queue is not wedged)."""
    r = await post_webhook(c, fid, b'{"normal": true}')
    assert r.status_code == 202, r.text
    e = await finished(c, who, r.json()["data"]["executionId"])
    assert e["status"] == "succeeded", e
    assert e["result"] == {"data": {"normal": True}}


# Bodies that must be stored and run as parsed.
ACCEPTED = [
    b"42",
    b"-0",
    b"-0.0",
    b" 42 ",
    b"1.0",
    b"1e5",
    b"-1.5E-7",
    b"0",
    b"true",
    b"false",
    b"null",
    b'""',
    b'"42"',
    b'"\\u0000"',
    b'"a\\u0000b\\n\\t\\"\\\\\\/"',
    b'"\\ud83d\\ude00 \xc3\xa9 \xe2\x80\xa8"',
    b"[]",
    b"{}",
    b"[[], {}, [{}]]",
    b"18446744073709551615",  # the largest integer orjson keeps an integer
    b"18446744073709551616",  # orjson reads it as a float: stored as that float on both
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b"1.7976931348623157e308",
    b"5e-324",
    b'{"\\u0000": [1, -0.0, 1e2], "\xc3\xa9": {"": null}}',
    nested(MAX_DEPTH),
    b'{"a":' * MAX_DEPTH + b"0" + b"}" * MAX_DEPTH,
]


async def test_any_json_value_is_stored_and_run_as_parsed(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(c, who, passing_flow("values"))
    other = await active_flow(c, who, passing_flow("other"))
    ids = []
    for raw in ACCEPTED:
        r = await post_webhook(c, fid, raw)
        assert r.status_code == 202, (raw, r.text)
        ids.append(r.json()["data"]["executionId"])
    for raw, eid in zip(ACCEPTED, ids, strict=True):
        expected = orjson.loads(raw)
        e = await finished(c, who, eid)
        assert e["status"] == "succeeded", (raw, e)
        assert canonical(e["input"]) == canonical(expected), raw
        assert canonical(e["result"]) == canonical({"data": expected}), raw
        assert canonical(e["steps"][0]["output"]) == canonical([expected]), raw
        r = await c.get(
            "/logs", params={"filter[tenant]": who.tenant, "filter[executionId]": eid}, headers=who.headers
        )
        assert r.status_code == 200, r.text
        logged = [entry for entry in r.json()["data"] if entry.get("message") == "message"]
        assert [canonical(entry["data"]) for entry in logged] == [canonical(expected)], raw
    # The list reads every row too (it used to reset the connection on SQLite).
    r = await c.get(f"/flows/{fid}/executions", params={"page[size]": 100}, headers=who.headers)
    assert r.status_code == 200, r.text
    assert {e["id"] for e in r.json()["data"]} == set(ids)
    if db.is_sqlite:  # stored as the text it was written as, never as a SQLite number
        async with db.read() as session:
            kinds = await session.execute(
                sa.text("SELECT DISTINCT typeof(input), typeof(result), typeof(steps) FROM executions")
            )
            # The steps document is packed (db/packed.py): a BLOB, never a number either.
            assert {tuple(row) for row in kinds} == {("text", "text", "blob")}
    await still_flows(c, who, other)


async def test_a_body_deeper_than_the_limit_is_refused_at_the_door(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    """254 deep used to be accepted and then wedge a runner batch; 255 to 1,024 answered a 503
    that no retry cures."""
    c = engine_client
    who = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(c, who, passing_flow("deep"))
    cases = [
        (depth, raw)
        for depth in (MAX_DEPTH + 1, 254, 255, 1024, 1025, 5000)
        for raw in (nested(depth), b'{"a":' * depth + b"0" + b"}" * depth)
    ]
    for depth, raw in cases:
        r = await post_webhook(c, fid, raw)
        assert r.status_code == 400, r.text
        message = r.json()["errors"][0]["message"]
        assert f"deeper than {MAX_DEPTH} levels" in message or "not valid JSON" in message, message
        if depth <= 1024:  # orjson itself refuses beyond: not valid JSON then
            assert (
                message == f"The body nests deeper than {MAX_DEPTH} levels of arrays and objects (the limit)."
            )
        r = await c.post(f"/flows/{fid}/executions", content=raw, headers={**JSON, **who.headers})
        assert r.status_code == 400, r.text
        assert r.json()["errors"][0]["code"] == 400
    async with db.read() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Execution)) == 0
    await still_flows(c, who, fid)


async def test_a_step_output_deeper_than_the_limit_fails_that_execution_alone(
    engine_client: Client, factory: Factory
) -> None:
    """A mapper wraps the input once more: with an input at the limit, the step's output is
    one level too deep. That execution fails with the reason; the next ones run."""
    c = engine_client
    who = await factory.user(tenant=await factory.tenant())
    graph = {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {"id": "out", "componentId": "log", "fields": {"includeData": True}},
        ],
        "edges": [{"source": "in", "target": "out", "config": {"mapper": {"wrapped": "$"}}}],
    }
    fid = await active_flow(c, who, flow_body(name="wrapper", graph=graph))
    other = await active_flow(c, who, passing_flow("other"))
    posted = await asyncio.gather(
        post_webhook(c, fid, nested(MAX_DEPTH)),
        *(post_webhook(c, fid, b'{"n": %d}' % i) for i in range(5)),
    )
    assert [r.status_code for r in posted] == [202] * 6
    deep, *good = [await finished(c, who, r.json()["data"]["executionId"]) for r in posted]
    assert deep["status"] == "failed", deep
    assert deep["error"].startswith("step out failed: "), deep["error"]
    assert f"nests deeper than {MAX_DEPTH} levels" in deep["error"], deep["error"]
    assert deep["result"] is None
    assert [e["status"] for e in good] == ["succeeded"] * 5
    assert [e["result"] for e in good] == [{"data": {"wrapped": {"n": i}}} for i in range(5)]
    await still_flows(c, who, other)


async def test_wait_for_a_scalar_result(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    who = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(c, who, passing_flow("sync"))
    r = await c.post(f"/webhooks/{fid}", params={"wait": "10"}, content=b"-0", headers=JSON)
    assert r.status_code == 200, r.text
    assert r.content == b"0"
