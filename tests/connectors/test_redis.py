"""The redis component against the real Redis on this machine."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from flowyard.config import Settings
from tests.connectors.conftest import outputs, require_server, step, step_error
from tests.engine.test_processes import _free_port

CREDS = {"url": "redis://127.0.0.1:6379/0"}


@pytest.fixture
async def direct() -> AsyncIterator[aioredis.Redis]:
    require_server("Redis", 6379)
    client = aioredis.Redis(host="127.0.0.1", port=6379)
    yield client
    await client.aclose()


def key() -> str:
    return f"flowyard-test:{uuid.uuid4().hex[:10]}"


async def test_set_with_ttl_then_get(
    http: httpx.AsyncClient, settings: Settings, direct: aioredis.Redis
) -> None:
    k = key()
    fields = {"key": k, "value": {"id": "id", "total": "qty * 2"}, "ttl": 60}
    out = await step(http, settings, "redis", "set", fields, CREDS, {"id": "A-1", "qty": 4})
    assert outputs(out) == [{"id": "A-1", "qty": 4}]  # passed on unchanged
    assert await direct.get(k) == b'{"id":"A-1","total":8}'
    assert 0 < await direct.pttl(k) <= 60_000
    out = await step(http, settings, "redis", "get", {"key": k}, CREDS)
    assert outputs(out) == [{"key": k, "value": {"id": "A-1", "total": 8}}]
    out = await step(http, settings, "redis", "get", {"key": k, "parseJson": False}, CREDS)
    assert outputs(out) == [{"key": k, "value": '{"id":"A-1","total":8}'}]
    out = await step(http, settings, "redis", "get", {"key": k + ":missing"}, CREDS)
    assert outputs(out) == [{"key": k + ":missing", "value": None}]
    await direct.delete(k)


async def test_key_from_message_data_is_one_key(
    http: httpx.AsyncClient, settings: Settings, direct: aioredis.Redis
) -> None:
    """RESP is length-prefixed: a key with line breaks and commands in it is just a key."""
    guard = key()
    await direct.set(guard, "still here")
    evil = f"{guard}:x\r\nFLUSHALL\r\nSET {guard} gone\r\n"
    out = await step(http, settings, "redis", "set", {"key": "{{ k }}", "value": "'v'"}, CREDS, {"k": evil})
    assert out.status == "succeeded", out.error
    assert await direct.get(guard) == b"still here"
    assert await direct.get(evil) == b"v"
    await direct.delete(guard, evil)


async def test_publish_reaches_a_subscriber(
    http: httpx.AsyncClient, settings: Settings, direct: aioredis.Redis
) -> None:
    channel = key()
    pubsub = direct.pubsub()
    await pubsub.subscribe(channel)
    await pubsub.get_message(timeout=2)  # the subscribe confirmation
    out = await step(http, settings, "redis", "publish", {"key": channel}, CREDS, {"order": 7})
    assert out.status == "succeeded", out.error
    got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
    assert got is not None and got["data"] == b'{"order":7}'
    await pubsub.aclose()


async def test_xadd_appends_fields_and_trims(
    http: httpx.AsyncClient, settings: Settings, direct: aioredis.Redis
) -> None:
    stream = key()
    for i in range(3):
        out = await step(
            http,
            settings,
            "redis",
            "xadd",
            {"key": stream, "value": {"n": "n", "tags": "tags"}},
            CREDS,
            {"n": i, "tags": ["a", "b"]},
        )
        assert out.status == "succeeded", out.error
    entries = await direct.xrange(stream)
    assert [e[1] for e in entries] == [{b"n": str(i).encode(), b"tags": b'["a","b"]'} for i in range(3)]
    error = step_error(
        await step(http, settings, "redis", "xadd", {"key": stream, "value": "n"}, CREDS, {"n": 1})
    )
    assert "xadd needs an object" in error
    # a command error: GET on a stream
    error = step_error(await step(http, settings, "redis", "get", {"key": stream}, CREDS))
    assert error.startswith("redis: ") and "WRONGTYPE" in error
    await direct.delete(stream)


async def test_errors_bad_credentials_closed_port_timeout_policy(
    http: httpx.AsyncClient, settings: Settings, closed_settings: Settings, silent_port: int
) -> None:
    require_server("Redis", 6379)
    bad = {"url": "redis://nosuchuser:wrong@127.0.0.1:6379/0"}
    error = step_error(await step(http, settings, "redis", "get", {"key": "k"}, bad))
    assert error.startswith("redis: ") and ("WRONGPASS" in error or "invalid" in error.lower()), error
    assert "wrong" not in error.replace("WRONGPASS", "")
    closed = {"url": f"redis://127.0.0.1:{_free_port()}/0"}
    error = step_error(await step(http, settings, "redis", "get", {"key": "k", "timeout": 3}, closed))
    assert error.startswith("redis: ") and (
        "refused" in error.lower() or "connect call failed" in error.lower()
    )
    silent = {"url": f"redis://127.0.0.1:{silent_port}/0"}
    error = step_error(await step(http, settings, "redis", "get", {"key": "k", "timeout": 0.5}, silent))
    assert error.startswith("redis: ") and "tim" in error.lower(), error
    error = step_error(await step(http, closed_settings, "redis", "get", {"key": "k"}, CREDS))
    assert "refusing to connect to 127.0.0.1" in error
    error = step_error(
        await step(http, settings, "redis", "get", {"key": "k"}, {"url": "redis://127.0.0.1/x"})
    )
    assert "database number" in error
    error = step_error(await step(http, settings, "redis", "get", {"key": "k"}, None))
    assert "credentials_id" in error


async def test_concurrent_steps_share_one_pool(
    http: httpx.AsyncClient, settings: Settings, direct: aioredis.Redis
) -> None:
    from flowyard.components.connectors import redis as connector

    await connector._POOLS.close_all()
    k = key()
    await direct.set(k, "1")
    outs = await asyncio.gather(*(step(http, settings, "redis", "get", {"key": k}, CREDS) for _ in range(20)))
    assert all(outputs(o) == [{"key": k, "value": 1}] for o in outs)
    assert len(connector._POOLS) == 1
    await direct.delete(k)


async def test_get_of_a_value_over_the_cap_fails_the_step_unread(
    http: httpx.AsyncClient, settings: Settings, direct: aioredis.Redis
) -> None:
    """STRLEN first: a value over FLOWYARD_CONNECTOR_MAX_RESULT_BYTES is never fetched."""
    capped = settings.model_copy(update={"connector_max_result_bytes": 64 * 1024})
    k = key()
    await direct.set(k, "x" * (64 * 1024 + 1))
    try:
        error = step_error(await step(http, capped, "redis", "get", {"key": k}, CREDS))
        assert error == (
            f"redis: the value of {k!r} is {64 * 1024 + 1} bytes, over 65536 bytes "
            "(FLOWYARD_CONNECTOR_MAX_RESULT_BYTES)"
        ), error
        await direct.set(k, "x" * 1000)
        out = await step(http, capped, "redis", "get", {"key": k}, CREDS)
        assert outputs(out) == [{"key": k, "value": "x" * 1000}]
    finally:
        await direct.delete(k)


async def test_xread_reply_stays_within_the_trigger_cap(settings: Settings, direct: aioredis.Redis) -> None:
    """Each entry over FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES is refused unsent; entries within it that
    would take one reply past it are read alone after the others, in stream order."""
    from flowyard.components.connectors.redis import COMPONENT, xread_events
    from flowyard.components.events import TriggerContext

    stream = key()
    capped = settings.model_copy(update={"max_trigger_payload_bytes": 1024})

    async def subscribed() -> None:
        return None

    fields = COMPONENT.parse_fields({"key": stream, "count": 10})
    ctx = TriggerContext("f" * 24, "in", fields, CREDS, capped, subscribed)
    events = xread_events(ctx)
    try:
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.3)  # the group exists once subscribed; entries come after
        sizes = [600, 600, 5000, 600, 10]
        async with direct.pipeline(transaction=True) as batch:  # one read sees them all
            for i, n in enumerate(sizes):
                batch.xadd(stream, {"i": str(i), "v": "x" * n})
            await batch.execute()
        got = [await first]
        while len(got) < len(sizes):
            got.append(await asyncio.wait_for(anext(events), 10))
        for event in got:
            await event.ack()
        assert [e.data["i"] if e.data else None for e in got] == [0, 1, None, 3, 4]
        assert [e.refused is not None for e in got] == [False, False, True, False, False]
        assert got[2].refused is not None and "of 5003 bytes" in got[2].refused, got[2].refused
        assert (await direct.xpending(stream, f"flowyard-{'f' * 24}"))["pending"] == 0
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        await direct.delete(stream)
