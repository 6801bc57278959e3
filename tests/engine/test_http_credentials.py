"""The http component against a real local HTTP server, with stored credentials."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_engine_e2e import active_flow


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"null")
        self.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        out = json.dumps({"received": body, "ok": True}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine_settings(engine_settings: Settings) -> Settings:
    """The upstream listens on loopback, which the network policy opens only when listed."""
    return engine_settings.model_copy(update={"http_allow_networks": ["127.0.0.0/8"]})


@pytest.fixture
def upstream() -> Iterator[str]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def http_flow(url: str, credentials_id: str) -> dict[str, Any]:
    return flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {
                    "id": "call",
                    "componentId": "http",
                    "credentials_id": credentials_id,
                    "fields": {
                        "url": url + "/orders/{{ id }}",
                        "method": "POST",
                        "body": {"order": "id", "qty": "n"},
                    },
                },
            ],
            "edges": [{"source": "in", "target": "call"}],
        }
    )


async def test_http_component_uses_stored_credentials(
    engine_client: httpx.AsyncClient, factory: Factory, upstream: str
) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(
        tenant=tenant,
        permissions=[
            "tenant.flows.read",
            "tenant.flows.create",
            "tenant.flows.update",
            "iam.secret.create",
            "iam.secret.read",
        ],
    )
    r = await c.post(
        "/secrets", json={"name": "upstream", "value": {"token": "t0ps3cret"}}, headers=member.headers
    )
    assert r.status_code == 201, r.text
    secret = r.json()["data"]
    assert "value" not in secret and "t0ps3cret" not in r.text
    listed = await c.get("/secrets", headers=member.headers)
    assert [s["id"] for s in listed.json()["data"]] == [secret["id"]] and "t0ps3cret" not in listed.text

    fid = await active_flow(c, member, http_flow(upstream, secret["id"]))
    r = await c.post(f"/webhooks/{fid}", params={"wait": 10}, json={"id": "A-7", "n": 3})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == 201 and r.json()["body"] == {
        "received": {"order": "A-7", "qty": 3},
        "ok": True,
    }
    assert _Recorder.seen == [
        {"path": "/orders/A-7", "auth": "Bearer t0ps3cret", "body": {"order": "A-7", "qty": 3}}
    ]


async def test_flow_with_unreadable_credentials_does_not_start(
    engine_client: httpx.AsyncClient, factory: Factory, upstream: str
) -> None:
    c = engine_client
    t1, t2 = await factory.tenant(), await factory.tenant()
    perms = ["tenant.flows.read", "tenant.flows.create", "tenant.flows.update", "iam.secret.create"]
    alice, bob = (
        await factory.user(tenant=t1, permissions=perms),
        await factory.user(tenant=t2, permissions=perms),
    )
    foreign = (
        await c.post("/secrets", json={"name": "b", "value": {"token": "x"}}, headers=bob.headers)
    ).json()["data"]["id"]
    # Another tenant's secret is refused when the flow is saved (issue 22), as an unknown one is.
    r = await c.post("/flows", json=http_flow(upstream, foreign), headers=alice.headers)
    assert r.status_code == 400, r.text
    assert f"credentials {foreign}: not found, or not usable" in r.json()["errors"][0]["message"]
    # A flow whose own secret is gone by the time it starts says why in the start answer.
    own = (
        await c.post("/secrets", json={"name": "a", "value": {"token": "y"}}, headers=alice.headers)
    ).json()["data"]["id"]
    r = await c.post("/flows", json=http_flow(upstream, own), headers=alice.headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    assert (await c.delete(f"/secrets/{own}", headers=alice.headers)).status_code == 200
    r = await c.post(f"/flows/{fid}/start", headers=alice.headers)
    assert r.status_code == 409, r.text
    assert f"credentials {own}: not found, or not usable" in r.json()["errors"][0]["message"]
    flow = (await c.get(f"/flows/{fid}", headers=alice.headers)).json()["data"]
    assert flow["status"] == "inactive"
    assert (await c.delete(f"/secrets/{foreign}", headers=alice.headers)).status_code == 404
    assert (await c.get("/secrets", headers=alice.headers)).status_code == 403


async def test_admin_sees_no_secret_values(engine_client: httpx.AsyncClient, admin: Account) -> None:
    r = await engine_client.post(
        "/secrets", json={"name": "n", "value": {"password": "pw-123456"}}, headers=admin.headers
    )
    assert r.status_code == 201
    for response in (r, await engine_client.get("/secrets", headers=admin.headers)):
        assert "pw-123456" not in response.text
