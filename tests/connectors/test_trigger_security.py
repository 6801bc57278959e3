"""Attacks on event triggers: a credential at a loopback or private address is refused by the
outbound policy before any connection; another tenant's credential cannot be used; a flow with
two event triggers or an event trigger with incoming edges does not start."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from flowyard.components.builtins import ComponentError
from flowyard.components.connectors.amqp import consume_events
from flowyard.components.connectors.mqtt import subscribe_events
from flowyard.components.connectors.redis import xread_events
from flowyard.config import Settings
from flowyard.triggers.leases import TriggerContext, TriggerFunction
from tests.conftest import Factory, flow_body, wait_until
from tests.connectors.conftest import REGISTRY

CASES = [
    ("amqp", consume_events, {"queue": "q"}, "amqp://guest:guest@{host}:5672/"),
    ("mqtt", subscribe_events, {"filter": "a/#"}, "mqtt://{host}:1883"),
    ("redis", xread_events, {"key": "s"}, "redis://{host}:6379/0"),
]


@pytest.mark.parametrize("host", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "[::1]"])
@pytest.mark.parametrize(("component", "events", "fields", "url"), CASES)
async def test_trigger_refuses_loopback_and_private_addresses(
    closed_settings: Settings,
    component: str,
    events: TriggerFunction,
    fields: dict[str, Any],
    url: str,
    host: str,
) -> None:
    subscribed = []

    async def on_subscribed() -> None:
        subscribed.append(True)

    comp = REGISTRY.get(component)
    assert comp is not None
    ctx = TriggerContext(
        flow_id="f" * 24,
        node_id="in",
        fields=comp.parse_fields(fields),
        credentials={"url": url.format(host=host)},
        settings=closed_settings,
        subscribed=on_subscribed,
    )
    stream = events(ctx)
    with pytest.raises(ComponentError, match="refusing to connect"):
        await anext(stream)
    assert not subscribed


async def _start_and_wait_inactive(
    c: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any]
) -> dict[str, Any]:
    r = await c.post("/flows", json=body, headers=headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    assert (await c.post(f"/flows/{fid}/start", headers=headers)).status_code == 200

    async def inactive() -> dict[str, Any] | None:
        flow = (await c.get(f"/flows/{fid}", headers=headers)).json()["data"]
        assert flow["status"] in ("starting", "inactive"), flow
        return flow if flow["status"] == "inactive" else None

    return dict(await wait_until(inactive, within=20))


def _trigger_graph(secret: str, **node: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "in",
                "componentId": "amqp",
                "function": "consume",
                "credentials_id": secret,
                "fields": {"queue": "orders"},
                **node,
            },
            {"id": "out", "componentId": "log"},
        ],
        "edges": [{"source": "in", "target": "out"}],
    }


PERMISSIONS = ["tenant.flows.read", "tenant.flows.create", "tenant.flows.update", "iam.secret.create"]


async def test_another_tenants_credential_cannot_feed_a_trigger(
    engine_client: httpx.AsyncClient, factory: Factory
) -> None:
    c = engine_client
    owner = await factory.user(tenant=await factory.tenant(), permissions=PERMISSIONS)
    thief = await factory.user(tenant=await factory.tenant(), permissions=PERMISSIONS)
    r = await c.post(
        "/secrets",
        json={"name": "mq", "value": {"url": "amqp://guest:guest@127.0.0.1:5672/"}},
        headers=owner.headers,
    )
    assert r.status_code == 201, r.text
    secret = r.json()["data"]["id"]
    # Refused when saved (issue 22), with the same words as for an unknown secret.
    r = await c.post("/flows", json=flow_body(graph=_trigger_graph(secret)), headers=thief.headers)
    assert r.status_code == 400, r.text
    message = r.json()["errors"][0]["message"]
    assert f"credentials {secret}: not found, or not usable" in message
    assert "127.0.0.1" not in r.text and "guest" not in r.text
    # The engine's own check (lifecycle and consumer, secrets.usable_clause through resolve)
    # stays as the defence for a secret deleted between start and subscription.


async def test_two_event_triggers_do_not_start(engine_client: httpx.AsyncClient, factory: Factory) -> None:
    c = engine_client
    member = await factory.user(tenant=await factory.tenant(), permissions=PERMISSIONS)
    r = await c.post(
        "/secrets", json={"name": "mq", "value": {"url": "amqp://127.0.0.1/"}}, headers=member.headers
    )
    secret = r.json()["data"]["id"]
    graph = _trigger_graph(secret)
    graph["nodes"].append({**graph["nodes"][0], "id": "in2"})
    graph["edges"].append({"source": "in2", "target": "out"})
    flow = await _start_and_wait_inactive(c, member.headers, flow_body(graph=graph))
    assert "at most one event trigger" in flow["statusMessage"]


async def test_unreachable_trigger_shows_in_status_message(
    engine_client: httpx.AsyncClient, factory: Factory
) -> None:
    """The default policy refuses 127.0.0.1: the consumer reconnects with back-off, the reason is
    the flow's statusMessage, and the flow never becomes active."""
    c = engine_client
    member = await factory.user(tenant=await factory.tenant(), permissions=PERMISSIONS)
    r = await c.post(
        "/secrets",
        json={"name": "mq", "value": {"url": "amqp://guest:secretpw@127.0.0.1:5672/"}},
        headers=member.headers,
    )
    secret = r.json()["data"]["id"]
    r = await c.post("/flows", json=flow_body(graph=_trigger_graph(secret)), headers=member.headers)
    fid = r.json()["data"]["id"]
    assert (await c.post(f"/flows/{fid}/start", headers=member.headers)).status_code == 200

    async def reconnecting() -> dict[str, Any] | None:
        flow = (await c.get(f"/flows/{fid}", headers=member.headers)).json()["data"]
        assert flow["status"] == "starting", flow
        return flow if "reconnecting in" in (flow["statusMessage"] or "") else None

    flow = await wait_until(reconnecting, within=20)
    assert "amqp: reconnecting in" in flow["statusMessage"]
    assert "refusing to connect to 127.0.0.1" in flow["statusMessage"]
    assert "secretpw" not in flow["statusMessage"]
    assert (await c.post(f"/flows/{fid}/stop", headers=member.headers)).status_code in (200, 409)
