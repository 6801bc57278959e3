"""Failure is a path (SPEC §11): retries with backoff, Retry-After, non-retryable errors,
failure edges, durable waits and idempotency keys, against a loopback HTTP server this test
starts, which fails a scripted number of times, then answers 200. SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Account, Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow, finished

Client = httpx.AsyncClient


class _Flaky(BaseHTTPRequestHandler):
    """``POST /<key>?fail=N&code=C[&after=S]``: the first N requests for ``key`` answer ``C``
    (with ``Retry-After: S`` when given), then 200. Every arrival is recorded."""

    seen: dict[str, list[dict[str, Any]]] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        args = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        key = path.strip("/")
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        with self.lock:
            arrivals = self.seen.setdefault(key, [])
            arrivals.append({"at": time.monotonic(), "key": self.headers.get("Idempotency-Key")})
            n = len(arrivals)
        code = int(args.get("code", "503")) if n <= int(args.get("fail", "0")) else 200
        out = json.dumps({"n": n}).encode()
        self.send_response(code)
        if code != 200 and "after" in args:
            self.send_header("Retry-After", args["after"])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    """The upstream listens on loopback, which the network policy opens only when listed (here)."""
    return engine_settings.model_copy(update={"http_allow_networks": ["127.0.0.0/8"]})


@pytest.fixture
def upstream() -> Iterator[str]:
    _Flaky.seen = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _call(url: str, retry: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": "call",
        "componentId": "http",
        "fields": {"url": url, "method": "POST", **fields},
    }
    if retry is not None:
        node["retry"] = retry
    return node


def _flow(*nodes: dict[str, Any], edges: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    nodes = ({"id": "in"}, *nodes)
    default = [{"source": a["id"], "target": b["id"]} for a, b in itertools.pairwise(nodes)]
    return flow_body(graph={"nodes": list(nodes), "edges": edges if edges is not None else default})


async def _run(c: Client, who: Account, fid: str, data: Any = None) -> dict[str, Any]:
    r = await c.post(f"/webhooks/{fid}", json=data if data is not None else {"order": 7})
    assert r.status_code == 202, r.text
    return await finished(c, who, r.json()["data"]["executionId"])


def _step(execution: dict[str, Any], node: str) -> dict[str, Any]:
    return next(s for s in execution["steps"] if s["nodeId"] == node)


async def test_retries_with_backoff_until_success(
    engine_client: Client, factory: Factory, upstream: str
) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    policy = {"maxAttempts": 4, "initialInterval": 0.2, "backoff": 2, "jitter": 0}
    fid = await active_flow(
        c, member, _flow(_call(f"{upstream}/a?fail=2&code=503", policy, idempotencyHeader=True))
    )
    e = await _run(c, member, fid)
    assert e["status"] == "succeeded", e
    step = _step(e, "call")
    assert step["status"] == "succeeded" and step["runs"] == 1 and step["attempts"] == 3
    assert [a["attempt"] for a in step["attemptErrors"]] == [1, 2]
    assert all("answered 503" in a["error"] for a in step["attemptErrors"])
    arrivals = _Flaky.seen["a"]
    assert len(arrivals) == 3
    # Never early: 0.2 s after the first failure, 0.4 s after the second (no jitter here).
    assert arrivals[1]["at"] - arrivals[0]["at"] >= 0.2
    assert arrivals[2]["at"] - arrivals[1]["at"] >= 0.4
    # One idempotency key for every attempt of the step (SPEC §11), naming the execution.
    keys = {a["key"] for a in arrivals}
    assert len(keys) == 1 and next(iter(keys)).startswith(f"{e['id']}:call:")
    # GET /logs shows each attempt's error.
    logs = (
        await c.get(
            "/logs",
            params={"filter[tenant]": tenant, "filter[executionId]": e["id"], "filter[stepId]": "call"},
            headers=member.headers,
        )
    ).json()["data"]
    retried = sorted(x["message"] for x in logs if x["level"] == "warn")
    assert len(retried) == 2
    assert "attempt 1 of 4 failed" in retried[0] and "answered 503" in retried[0]
    assert "attempt 2 of 4 failed" in retried[1]


async def test_retry_after_is_honoured_and_a_long_wait_parks(
    engine_client: Client, factory: Factory, upstream: str
) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    policy = {"maxAttempts": 3, "initialInterval": 0.1, "maxInterval": 30, "jitter": 0}
    call = _call(f"{upstream}/ra?fail=1&code=429&after=2", policy, idempotencyHeader=True)
    fid = await active_flow(c, member, _flow(call))
    r = await c.post(f"/webhooks/{fid}", json={})
    eid = r.json()["data"]["executionId"]

    async def parked() -> dict[str, Any] | None:
        e = (await c.get(f"/executions/{eid}", headers=member.headers)).json()["data"]
        assert e["status"] != "failed", e
        return e if e["status"] in ("waiting", "succeeded") else None

    seen = await wait_until(parked)
    e = await finished(c, member, eid)
    assert e["status"] == "succeeded" and _step(e, "call")["attempts"] == 2
    arrivals = _Flaky.seen["ra"]
    assert len(arrivals) == 2 and arrivals[1]["at"] - arrivals[0]["at"] >= 2.0
    # The key survives the park: the resumed attempt sends the same one.
    assert arrivals[0]["key"] == arrivals[1]["key"] == f"{eid}:call:0"
    if seen["status"] == "waiting":  # (it may have finished before the first look)
        assert seen["resumeAt"] is not None
        assert _step(seen, "call")["status"] == "waiting"


async def test_non_retryable_answer_fails_at_once(
    engine_client: Client, factory: Factory, upstream: str
) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    policy = {"maxAttempts": 5, "initialInterval": 0.1}
    fid = await active_flow(c, member, _flow(_call(f"{upstream}/nf?fail=9&code=404", policy)))
    e = await _run(c, member, fid)
    assert e["status"] == "failed" and "answered 404" in e["error"]
    step = _step(e, "call")
    assert step["status"] == "failed" and step["attempts"] == 1
    assert len(_Flaky.seen["nf"]) == 1


async def test_exhausted_retries_take_the_failure_edge(
    engine_client: Client, factory: Factory, upstream: str
) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    policy = {"maxAttempts": 2, "initialInterval": 0.1, "jitter": 0}
    nodes = (
        _call(f"{upstream}/down?fail=99&code=503", policy),
        {"id": "ok", "componentId": "jsonata", "fields": {"expression": "'sent'"}},
        {"id": "dead", "componentId": "jsonata", "fields": {"expression": "$"}},
    )
    edges = [
        {"source": "in", "target": "call"},
        {"source": "call", "target": "ok"},
        {"source": "call", "target": "dead", "on": "failure"},
    ]
    fid = await active_flow(c, member, _flow(*nodes, edges=edges))
    e = await _run(c, member, fid, {"order": 42})
    assert e["status"] == "succeeded", e
    call = _step(e, "call")
    assert call["status"] == "failed" and call["attempts"] == 2 and "answered 503" in call["error"]
    assert {s["nodeId"] for s in e["steps"]} == {"in", "call", "dead"}  # "ok" never ran
    out = e["result"]["data"]
    assert out["input"] == {"order": 42}
    assert out["error"]["step"] == "call" and out["error"]["component"] == "http"
    assert out["error"]["attempts"] == 2 and "answered 503" in out["error"]["message"]
    assert len(_Flaky.seen["down"]) == 2

    # Without a failure edge to take, the same failure fails the execution.
    edges = [{"source": "in", "target": "call"}, {"source": "call", "target": "ok"}]
    fid2 = await active_flow(c, member, _flow(*nodes[:2], edges=edges))
    assert (await _run(c, member, fid2))["status"] == "failed"


async def test_a_long_delay_parks_the_execution(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(c, member, _flow({"id": "d", "componentId": "delay", "fields": {"seconds": 2}}))
    r = await c.post(f"/webhooks/{fid}", json={"x": 1})
    eid = r.json()["data"]["executionId"]

    async def waiting() -> dict[str, Any] | None:
        e = (await c.get(f"/executions/{eid}", headers=member.headers)).json()["data"]
        return e if e["status"] == "waiting" else None

    w = await wait_until(waiting)
    assert w["resumeAt"] is not None
    e = await finished(c, member, eid)
    assert e["status"] == "succeeded" and e["result"] == {"data": {"x": 1}}
    d = _step(e, "d")
    assert d["runs"] == 1 and d["status"] == "succeeded"
    created = datetime.fromisoformat(e["createdAt"])
    assert (datetime.fromisoformat(e["finishedAt"]) - created).total_seconds() >= 2.0


async def test_bad_retry_and_on_fields_are_refused(engine_client: Client, admin: Account) -> None:
    c = engine_client
    body = _flow(
        {
            "id": "call",
            "componentId": "http",
            "fields": {"url": "https://example.com/"},
            "retry": {"maxAttempts": 0, "backoff": 0.5, "jitter": 2, "initialInterval": "x", "nope": 1},
        },
        edges=[{"source": "in", "target": "call", "on": "maybe"}],
    )
    r = await c.post("/flows", json=body, headers=admin.headers)
    assert r.status_code == 400, r.text
    fields = {e["field"] for e in r.json()["errors"]}
    assert {
        "graph.nodes[1].retry.maxAttempts",
        "graph.nodes[1].retry.backoff",
        "graph.nodes[1].retry.jitter",
        "graph.nodes[1].retry.initialInterval",
        "graph.nodes[1].retry.nope",
        "graph.edges[0].on",
    } <= fields
    r = await c.post("/flows", json=_flow({"id": "x", "retry": 3}), headers=admin.headers)
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "graph.nodes[1].retry"
    # A valid policy and failure edge are kept as given.
    good = _flow(
        _call("https://example.com/", {"maxAttempts": 3, "initialInterval": 2}),
        {"id": "dlq"},
        edges=[{"source": "in", "target": "call"}, {"source": "call", "target": "dlq", "on": "failure"}],
    )
    r = await c.post("/flows", json=good, headers=admin.headers)
    assert r.status_code == 201, r.text
    graph = r.json()["data"]["graph"]
    assert graph["nodes"][1]["retry"] == {"maxAttempts": 3, "initialInterval": 2}
    assert graph["edges"][1]["on"] == "failure"
