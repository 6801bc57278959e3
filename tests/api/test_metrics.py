"""GET /metrics over ASGI: who may read it (decided in ``metrics.allowed``), bounded
labels, request ids, and the JSON log line format."""

from __future__ import annotations

import json
import logging
import os

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from flowyard import logconfig, metrics
from flowyard.config import Settings
from tests.conftest import Account


def _keys(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.parametrize(
    ("client", "authorization", "token", "ok"),
    [
        ("127.0.0.1", None, None, True),
        ("127.8.9.10", None, None, True),
        ("::1", None, None, True),
        ("10.0.0.7", None, None, False),
        ("192.168.1.20", None, None, False),
        ("203.0.113.9", None, None, False),
        ("::ffff:10.0.0.7", None, None, False),
        ("testclient", None, None, False),
        (None, None, None, False),
        ("", None, None, False),
        # A token configured: it is required, from loopback too, and compared exactly.
        ("203.0.113.9", "Bearer s3cret-metrics", "s3cret-metrics", True),
        ("203.0.113.9", "bearer s3cret-metrics", "s3cret-metrics", True),
        ("127.0.0.1", None, "s3cret-metrics", False),
        ("203.0.113.9", "Bearer wrong", "s3cret-metrics", False),
        ("203.0.113.9", "Bearer s3cret-metric", "s3cret-metrics", False),
        ("203.0.113.9", "Bearer s3cret-metricsX", "s3cret-metrics", False),
        ("203.0.113.9", "Basic s3cret-metrics", "s3cret-metrics", False),
        ("203.0.113.9", "s3cret-metrics", "s3cret-metrics", False),
        ("203.0.113.9", "Bearer ", "s3cret-metrics", False),
    ],
)
def test_who_may_read_metrics(
    client: str | None, authorization: str | None, token: str | None, ok: bool
) -> None:
    assert metrics.allowed(client, authorization, token) is ok


async def test_metrics_endpoint_applies_the_rule(app: FastAPI, settings: Settings) -> None:
    # The ASGI client address stands in for a remote peer: no connection leaves the process.
    async def get(client: tuple[str, int], headers: dict[str, str] | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://flowyard.test") as c:
            return await c.get("/metrics", headers=headers)

    r = await get(("127.0.0.1", 5000))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "flowyard_queue_executions" in r.text
    r = await get(("203.0.113.9", 5000))
    assert r.status_code == 403 and "flowyard_" not in r.text
    assert r.json()["errors"][0]["code"] == 403

    token = "tok-" + os.urandom(8).hex()
    app.state.settings = settings.model_copy(update={"metrics_token": SecretStr(token)})
    assert (await get(("127.0.0.1", 5000))).status_code == 403
    assert (await get(("203.0.113.9", 5000), {"Authorization": "Bearer nope"})).status_code == 403
    assert (await get(("203.0.113.9", 5000), {"Authorization": f"Bearer {token}"})).status_code == 200


async def test_a_thousand_random_flow_ids_add_no_label_values(
    client: httpx.AsyncClient, admin: Account
) -> None:
    async def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        r = await client.get("/metrics")
        assert r.status_code == 200
        return _keys(r.text)

    # Warm-up: the label values a refused webhook and a flow read use exist afterwards.
    assert (await client.post(f"/webhooks/{os.urandom(12).hex()}", json={})).status_code == 404
    assert (await client.get(f"/flows/{os.urandom(12).hex()}", headers=admin.headers)).status_code == 404
    assert (await client.get(f"/nothing/{os.urandom(4).hex()}")).status_code == 404
    await scrape()
    before = await scrape()
    for _ in range(1000):
        r = await client.post(f"/webhooks/{os.urandom(12).hex()}", json={})
        assert r.status_code == 404
    for _ in range(20):
        await client.get(f"/flows/{os.urandom(12).hex()}", headers=admin.headers)
        await client.get(f"/nothing/{os.urandom(4).hex()}")
        await client.request("BREW", f"/flows/{os.urandom(12).hex()}")
    after = await scrape()
    added = set(after) - set(before)
    # Only the scrape and the odd method may add a series, and never with an id in it.
    for name, labels in added:
        assert dict(labels).get("method") == "other" or dict(labels).get("route") == "/metrics", (
            name,
            labels,
        )
    for _name, labels in after:
        for _k, v in labels:
            assert len(v) < 24 or v.startswith("/"), labels
    hooks = ("flowyard_webhooks_total", (("outcome", "unknown_flow"),))
    assert after[hooks] - before[hooks] == 1000
    route = (
        "flowyard_http_requests_total",
        (("method", "POST"), ("route", "/webhooks/{flowId}"), ("status", "404")),
    )
    assert after[route] - before[route] == 1000
    unmatched = (
        "flowyard_http_requests_total",
        (("method", "GET"), ("route", "unmatched"), ("status", "404")),
    )
    assert after[unmatched] - before[unmatched] == 20


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        ("abc-123", True),
        ("trace.id:span_9", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("has space", False),
        ('quote"d', False),
        ("semi;colon", False),
        ("", False),
    ],
)
async def test_request_id_is_echoed_only_when_sane(
    client: httpx.AsyncClient, sent: str, echoed: bool
) -> None:
    r = await client.get("/health", headers={"X-Request-ID": sent})
    rid = r.headers["x-request-id"]
    if echoed:
        assert rid == sent
    else:
        assert rid != sent and len(rid) == 16 and int(rid, 16) >= 0


def test_json_log_line_carries_its_context() -> None:
    formatter = logconfig.JsonFormatter()
    record = logging.LogRecord("flowyard.test", logging.WARNING, __file__, 1, "hello %s", ("world",), None)

    def in_context() -> str:
        logconfig.request_id.set("rid-1")
        logconfig.set_execution("f" * 24, "e" * 24, "t" * 24)
        return formatter.format(record)

    import contextvars

    line = contextvars.copy_context().run(in_context)
    out = json.loads(line)
    assert out["message"] == "hello world" and out["level"] == "warning" and out["logger"] == "flowyard.test"
    assert out["requestId"] == "rid-1" and out["flowId"] == "f" * 24
    assert out["executionId"] == "e" * 24 and out["tenant"] == "t" * 24
    assert out["time"].endswith("Z")
    # Outside the context: none of those keys.
    assert "requestId" not in json.loads(formatter.format(record))
    # uvicorn's access line: no query string (callers put credentials there).
    access = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/flows?token=hunter2", "1.1", 200),
        None,
    )
    text = formatter.format(access)
    assert "hunter2" not in text and "/flows" in json.loads(text)["message"]
    assert "hunter2" not in logconfig.TextFormatter().format(access)
