"""Issue 17, findings 2 and 3 as attacks against the real engine (runner processes, loopback
HTTP): a URL's userinfo never reaches a step error or a log entry, and a flow's `respond` node
cannot hand an anonymous caller cookies, CORS grants or a redirect to another origin."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.components.builtins import reply_header_refusal
from flowyard.components.netpolicy import redact_url, scrub_userinfo
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from flowyard.webhooks.handler import reply_headers
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_engine_e2e import active_flow, finished


class _Failing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    return engine_settings.model_copy(update={"http_allow_networks": ["127.0.0.0/8"]})


@pytest.fixture
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def _http_flow(url: str) -> dict[str, Any]:
    return flow_body(
        name="leaky",
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "call", "componentId": "http", "fields": {"url": url, "timeout": 5}},
            ],
            "edges": [{"source": "in", "target": "call"}],
        },
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_userinfo_never_reaches_a_step_error_or_a_log(
    engine_client: httpx.AsyncClient, factory: Factory, upstream: int
) -> None:
    """An upstream that answers 500, a destination the policy refuses, a port nobody listens
    on, and a URL put together from the message: each error names the URL with `***` for the
    password, and the password (raw or percent-decoded) is in no error text and no log message
    a flow reader sees."""
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    cases = {
        f"http://alice:pa%3Ass-w0rd-1@127.0.0.1:{upstream}/x": "answered 500",
        "http://bob:hunter2-secret-2@10.1.2.3/": "10.0.0.0/8",
        f"http://carol:c4rol-secret-3@127.0.0.1:{_closed_port()}/": "failed",
        f"http://dave:{{{{ pw }}}}@127.0.0.1:{upstream}/": "answered 500",
    }
    secrets = ["pa%3Ass-w0rd-1", "pa:ss-w0rd-1", "hunter2-secret-2", "c4rol-secret-3", "d4ve-secret-4"]
    for url, expected in cases.items():
        fid = await active_flow(c, member, _http_flow(url))
        r = await c.post(f"/webhooks/{fid}", json={"pw": "d4ve-secret-4"})
        assert r.status_code == 202, r.text
        e = await finished(c, member, r.json()["data"]["executionId"])
        assert e["status"] == "failed", e
        user = url.split("//")[1].split(":")[0]
        assert f"http://{user}:***@" in e["error"] and expected in e["error"], e["error"]
        logs = await c.get(
            "/logs",
            params={"filter[tenant]": tenant, "filter[executionId]": e["id"], "page[size]": 100},
            headers=member.headers,
        )
        assert logs.status_code == 200, logs.text
        texts = [e["error"], *(str(s.get("error")) for s in e["steps"])]
        texts += [entry["message"] for entry in logs.json()["data"]]
        assert any(f"{user}:***@" in t for t in texts[1:])
        for secret in secrets:
            assert not [t for t in texts if secret in t], (secret, texts)


def test_redaction_rules() -> None:
    assert redact_url("https://user:secret@host:8443/p?q=1") == "https://user:***@host:8443/p?q=1"
    assert redact_url("https://user@host/") == "https://user@host/"
    assert redact_url("https://host/a@b") == "https://host/a@b"
    assert redact_url("https://a:b:c@d@host/") == "https://a:***@host/"
    url = "https://u:p%40ss@host/"
    assert scrub_userinfo(f"cannot reach {url} with p@ss or p%40ss", url) == (
        "cannot reach https://u:***@host/ with *** or ***"
    )


REFUSED = {
    "Set-Cookie": "session=attacker; Path=/",
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Credentials": "true",
    "Location": "https://evil.example/",
    "WWW-Authenticate": "Basic",
    "Strict-Transport-Security": "max-age=0",
    "Content-Security-Policy": "default-src *",
    "Refresh": "0; url=https://evil.example/",
    "Content-Type": "text/html",
    "Content-Disposition": "attachment; filename=x.exe",
    "X-Accel-Redirect": "/internal/secret",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_respond_node_cannot_set_unsafe_headers(
    engine_client: httpx.AsyncClient, admin: Account, name: str
) -> None:
    body = flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {
                    "id": "reply",
                    "componentId": "respond",
                    "fields": {"status": 302, "headers": {name: REFUSED[name]}},
                },
            ],
            "edges": [{"source": "in", "target": "reply"}],
        }
    )
    r = await engine_client.post("/flows", json=body, headers=admin.headers)
    assert r.status_code == 400, r.text
    assert name in r.text
    # Also dropped on the way out (a flow saved before the rule, an execution in flight).
    assert reply_headers({name: REFUSED[name]}) == {}


@pytest.mark.parametrize(
    ("value", "ok"),
    [("/next", True), ("//evil.example/", False), ("/\\evil.example", False), ("http://x/", False)],
)
def test_location_must_be_a_path_here(value: str, ok: bool) -> None:
    assert (reply_header_refusal("Location", value) is None) is ok


async def test_respond_node_keeps_the_allowed_headers(
    engine_client: httpx.AsyncClient, admin: Account
) -> None:
    allowed = {
        "Cache-Control": "no-store",
        "ETag": '"v1"',
        "X-Order-Id": "A-7",
        "Location": "/orders/A-7",
        "Content-Type": "application/problem+json",
    }
    body = flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "reply", "componentId": "respond", "fields": {"status": 201, "headers": allowed}},
            ],
            "edges": [{"source": "in", "target": "reply"}],
        }
    )
    fid = await active_flow(engine_client, admin, body)
    r = await engine_client.post(f"/webhooks/{fid}", params={"wait": 10}, json={"q": 1})
    assert r.status_code == 201, r.text
    for name, value in allowed.items():
        assert r.headers[name] == value
    assert "set-cookie" not in r.headers and "access-control-allow-origin" not in r.headers


async def test_a_flow_saved_before_the_header_policy_still_runs_without_the_refused_headers(
    engine_client: httpx.AsyncClient, admin: Account, db: Database
) -> None:
    """The policy refuses at save; a flow stored before it (its graph written here directly, as an
    older flowyard stored it) is not stopped by it: it runs, and the refused headers are dropped."""
    headers = {"Set-Cookie": "session=attacker", "Access-Control-Allow-Origin": "*", "X-Order-Id": "7"}
    safe = flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "reply", "componentId": "respond", "fields": {"status": 200, "body": "'ok'"}},
            ],
            "edges": [{"source": "in", "target": "reply"}],
        }
    )
    r = await engine_client.post("/flows", json=safe, headers=admin.headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    graph = {**safe["graph"]}
    graph["nodes"] = [graph["nodes"][0], {**graph["nodes"][1], "fields": {"status": 200, "headers": headers}}]
    async with db.write() as session:
        await session.execute(sa.update(Flow).where(Flow.id == fid).values(graph=graph))
    r = await engine_client.post(f"/flows/{fid}/start", headers=admin.headers)
    assert r.status_code in (200, 202), r.text
    active = await active_flow_ready(engine_client, admin, fid)
    assert active
    r = await engine_client.post(f"/webhooks/{fid}", params={"wait": 10}, json={"q": 1})
    assert r.status_code == 200, r.text
    assert r.headers["X-Order-Id"] == "7"
    assert "set-cookie" not in r.headers and "access-control-allow-origin" not in r.headers


async def active_flow_ready(c: httpx.AsyncClient, who: Account, fid: str) -> bool:
    from tests.conftest import wait_until

    async def active() -> bool:
        r = await c.get(f"/flows/{fid}", headers=who.headers)
        return bool(r.json()["data"]["status"] == "active")

    return bool(await wait_until(active))
