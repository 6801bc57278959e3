"""The amqp component against the real RabbitMQ on this machine."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aiormq
import httpx
import orjson
import pytest
from aiormq.abc import AbstractChannel

from flowyard.config import Settings
from tests.connectors.conftest import outputs, require_server, step, step_error
from tests.engine.test_processes import _free_port

CREDS = {"url": "amqp://guest:guest@127.0.0.1:5672/"}


@pytest.fixture
async def channel() -> AsyncIterator[AbstractChannel]:
    require_server("RabbitMQ", 5672)
    connection = await aiormq.connect("amqp://guest:guest@127.0.0.1:5672/")
    ch = await connection.channel()
    yield ch
    await connection.close()


async def _queue(ch: AbstractChannel) -> str:
    name = f"flowyard-test-{uuid.uuid4().hex[:10]}"
    await ch.queue_declare(name, auto_delete=False, arguments={"x-expires": 60_000})
    return name


async def test_publish_is_persistent_confirmed_and_routed(
    http: httpx.AsyncClient, settings: Settings, channel: AbstractChannel
) -> None:
    queue = await _queue(channel)
    fields = {"routingKey": "{{ target }}", "body": {"order": "id"}, "headers": {"x-src": "test"}}
    out = await step(http, settings, "amqp", "publish", fields, CREDS, {"id": "A-9", "target": queue})
    assert outputs(out) == [{"id": "A-9", "target": queue}]
    got = await channel.basic_get(queue, no_ack=True)
    assert orjson.loads(got.body) == {"order": "A-9"}
    props = got.header.properties
    assert props.delivery_mode == 2 and props.content_type == "application/json"
    assert props.message_id == f"{out.execution_id}:c:0" and props.headers == {"x-src": "test"}
    await channel.queue_delete(queue)


async def test_unroutable_and_unknown_exchange_fail_then_the_link_recovers(
    http: httpx.AsyncClient, settings: Settings, channel: AbstractChannel
) -> None:
    queue = await _queue(channel)
    error = step_error(
        await step(http, settings, "amqp", "publish", {"routingKey": f"{queue}-nobody"}, CREDS, {"a": 1})
    )
    assert "no queue took the message" in error
    error = step_error(
        await step(
            http,
            settings,
            "amqp",
            "publish",
            {"exchange": f"nope-{queue}", "routingKey": queue},
            CREDS,
            {"a": 1},
        )
    )
    assert "refused the publish" in error and "NOT_FOUND" in error, error
    # the broker closed that channel; the next publish gets a new one
    out = await step(http, settings, "amqp", "publish", {"routingKey": queue}, CREDS, {"a": 2})
    assert out.status == "succeeded", out.error
    got = await channel.basic_get(queue, no_ack=True)
    assert orjson.loads(got.body) == {"a": 2}
    await channel.queue_delete(queue)


async def test_errors_bad_credentials_closed_port_timeout_policy(
    http: httpx.AsyncClient, settings: Settings, closed_settings: Settings, silent_port: int
) -> None:
    require_server("RabbitMQ", 5672)
    bad = {"url": "amqp://guest:wrong-pw@127.0.0.1:5672/"}
    error = step_error(await step(http, settings, "amqp", "publish", {"routingKey": "x", "timeout": 5}, bad))
    assert error.startswith("amqp: ") and "wrong-pw" not in error
    assert "ACCESS_REFUSED" in error or "Authentication" in error, error
    closed = {"url": f"amqp://guest:guest@127.0.0.1:{_free_port()}/"}
    error = step_error(
        await step(http, settings, "amqp", "publish", {"routingKey": "x", "timeout": 3}, closed)
    )
    assert error.startswith("amqp: ") and "connect call failed" in error.lower(), error
    silent = {"url": f"amqp://guest:guest@127.0.0.1:{silent_port}/"}
    error = step_error(
        await step(http, settings, "amqp", "publish", {"routingKey": "x", "timeout": 0.5}, silent)
    )
    assert error == "amqp: no confirmation within 0.5 s"
    error = step_error(await step(http, closed_settings, "amqp", "publish", {"routingKey": "x"}, CREDS))
    assert "refusing to connect to 127.0.0.1" in error
