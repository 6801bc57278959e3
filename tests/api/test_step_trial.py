"""Test one step (SPEC §12, issue 20's "test this step"): ``POST /flows/{id}/test-step`` runs a
node alone on a sample message in a runner process (the engine's pool, or a small one of the
API process's own under ``--no-engine``) and answers its output or its error; nothing is
stored. Who may (SPEC §2): ``tenant.flows.update`` on a visible flow; another tenant's member
404, a token narrowed to ``tenant.flows.read`` 403, anonymous 401. Flow code stays contained:
a runaway step fails alone with its limit, a URL to 127.0.0.1 is refused by the network policy.
On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.db.session import Database
from flowyard.queue.models import Execution
from tests.api.test_access import cheap_password_hashing, narrowed
from tests.conftest import Account, Factory, flow_body

__all__ = ["cheap_password_hashing"]


def code(source: str, nid: str = "calc") -> dict[str, Any]:
    return {"id": nid, "componentId": "code", "fields": {"source": source}}


async def a_flow(c: httpx.AsyncClient, who: Account) -> str:
    r = await c.post("/flows", json=flow_body(), headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


async def trial(c: httpx.AsyncClient, fid: str, headers: dict[str, str], body: Any) -> httpx.Response:
    return await c.post(f"/flows/{fid}/test-step", json=body, headers=headers)


async def executions(db: Database) -> int:
    async with db.read() as session:
        return int(await session.scalar(sa.select(sa.func.count()).select_from(Execution)) or 0)


@pytest.mark.parametrize("with_engine", [False, True])
async def test_a_step_runs_alone_on_a_sample_and_nothing_is_stored(
    with_engine: bool,
    client: httpx.AsyncClient,
    engine_client: httpx.AsyncClient,
    factory: Factory,
    db: Database,
) -> None:
    c = engine_client if with_engine else client
    member = await factory.user(tenant=await factory.tenant())
    fid = await a_flow(c, member)
    before = await executions(db)
    source = (
        "function main(data, ctx) { ctx.log('info', 'summing ' + data.items.length);"
        " return {total: data.items.reduce((a, b) => a + b, 0)}; }"
    )
    r = await trial(c, fid, member.headers, {"node": code(source), "data": {"items": [1, 2, 3]}})
    assert r.status_code == 200, r.text
    out = r.json()["data"]
    assert (out["status"], out["output"], out["error"], out["messagesOut"]) == (
        "succeeded",
        [{"total": 6}],
        None,
        1,
    )
    logs = [(e["level"], e["message"]) for e in out["logs"]]
    assert logs[0] == ("info", "summing 3") and logs[1][1].startswith("step calc (code) ran 1 time(s)"), logs

    r = await trial(
        c,
        fid,
        member.headers,
        {"node": {"id": "m", "componentId": "jsonata", "fields": {"expression": "a * 2"}}, "data": {"a": 21}},
    )
    assert r.json()["data"]["output"] == [42], r.text

    r = await trial(
        c, fid, member.headers, {"node": code("function main(d) {\n  return d.x.y;\n}"), "data": {}}
    )
    out = r.json()["data"]
    assert r.status_code == 200 and out["status"] == "failed" and out["output"] is None, r.text
    assert "TypeError" in out["error"] and "line 2" in out["error"], out["error"]
    assert await executions(db) == before, "a trial run stores no execution"


async def test_flow_code_stays_contained(client: httpx.AsyncClient, factory: Factory) -> None:
    member = await factory.user(tenant=await factory.tenant())
    fid = await a_flow(client, member)
    r = await trial(client, fid, member.headers, {"node": code("function main(d) { for (;;) {} }")})
    out = r.json()["data"]
    assert out["status"] == "failed" and "CPU" in out["error"], out
    http = {
        "id": "call",
        "componentId": "http",
        "fields": {"url": "http://127.0.0.1:9/secret", "method": "GET"},
    }
    out = (await trial(client, fid, member.headers, {"node": http})).json()["data"]
    assert out["status"] == "failed" and "refusing to connect" in out["error"], out
    assert (await client.get("/health")).status_code == 200


async def test_who_may_test_a_step(client: httpx.AsyncClient, factory: Factory) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    fid = await a_flow(client, member)
    body = {"node": code("function main(d) { return d; }"), "data": {"k": 1}}
    stranger = await factory.user(tenant=await factory.tenant())
    r = await trial(client, fid, stranger.headers, body)
    assert r.status_code == 404, "another tenant's flow does not exist for its members"
    reader = await narrowed(client, member, "tenant.flows.read")
    assert (await trial(client, fid, reader, body)).status_code == 403
    assert (await trial(client, fid, {}, body)).status_code == 401
    loner = await factory.user(tenant=None)
    assert (await trial(client, fid, loner.headers, body)).status_code == 404
    updater = await narrowed(client, member, "tenant.flows.update")
    assert (await trial(client, fid, updater, body)).json()["data"]["output"] == [{"k": 1}]


async def test_bad_trials_are_refused_with_every_problem(client: httpx.AsyncClient, factory: Factory) -> None:
    member = await factory.user(tenant=await factory.tenant())
    fid = await a_flow(client, member)
    cases: list[tuple[Any, str]] = [
        ({"node": {"id": "in", "componentId": "webhook"}}, "a trigger has nothing to test"),
        ({"node": {"id": "w", "componentId": "delay", "fields": {"seconds": 1}}}, "a delay waits inside"),
        ({"node": {"id": "x", "componentId": "nope"}}, "no installed component 'nope'"),
        ({"node": {"id": "m", "componentId": "jsonata", "fields": {}}}, "node.fields"),
        ({"node": code("x"), "extra": 1}, "extra: is not a known field"),
        ({"node": {"componentId": "jsonata", "fields": {"expression": "1"}}}, "node.id: is required"),
        ([1, 2], "must be a JSON object"),
        (
            {
                "node": {
                    "id": "c",
                    "componentId": "code",
                    "fields": {"source": "function main(d) { return d; }"},
                    "credentials_id": "0" * 24,
                }
            },
            "credentials_id",
        ),
    ]
    for body, expected in cases:
        r = await trial(client, fid, member.headers, body)
        assert r.status_code == 400, (body, r.text)
        assert expected in r.text, (expected, r.text)
    r = await client.post(
        f"/flows/{fid}/test-step",
        content=b"{",
        headers={**member.headers, "content-type": "application/json"},
    )
    assert r.status_code == 400
