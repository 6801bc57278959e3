"""Event triggers end to end through real `flowyard serve` subprocesses and the real brokers
(RabbitMQ 5672, Mosquitto 1883, Redis 6379): N messages -> N executions, none twice; stopping
the flow removes the consumer from the broker; a SIGKILLed consumer's lease is taken over and
its unacknowledged messages run once each."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import aiormq
import httpx
import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from pamqp import commands as spec

from flowyard.queue.models import Execution
from flowyard.queue.trigger_lease import TriggerLease
from tests.connectors.conftest import require_server
from tests.engine.test_processes import Cluster, _empty, _login, _query

pytestmark = [pytest.mark.slow]

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
MQTT_URL = "mqtt://127.0.0.1:1883"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _sqlite_cluster(tmp: Path, *, allow_loopback: bool = True) -> Cluster:
    c = Cluster(f"sqlite+aiosqlite:///{(tmp / 'flowyard.db').resolve()}", tmp)
    # Two engines on one SQLite file stand for two machines here: the one-serve lock is lifted.
    c.env["FLOWYARD_SERVE_LOCK"] = "false"
    if allow_loopback:
        c.env["FLOWYARD_OUTBOUND_ALLOW_NETWORKS"] = "127.0.0.0/8"
    return c


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Cluster]:
    c = _sqlite_cluster(tmp_path)
    c.start("serve", "serve")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


def _wait(what: str, check: Callable[[], Any], seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds  # a liveness bound, generous for a loaded machine
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _trigger_flow(c: Cluster, headers: dict[str, str], url: str, node: dict[str, Any]) -> str:
    r = httpx.post(
        f"{c.base}/secrets",
        json={"name": f"broker-{uuid.uuid4().hex[:6]}", "value": {"url": url}},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    body = {
        "name": "trigger flow",
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "credentials_id": r.json()["data"]["id"], **node},
                {"id": "out", "componentId": "log", "fields": {"level": "info"}},
            ],
            "edges": [{"source": "in", "target": "out"}],
        },
    }
    r = httpx.post(f"{c.base}/flows", json=body, headers=headers)
    assert r.status_code == 201, r.text
    fid = str(r.json()["data"]["id"])
    assert httpx.post(f"{c.base}/flows/{fid}/start", headers=headers).status_code == 200
    return fid


def _status(c: Cluster, headers: dict[str, str], fid: str) -> dict[str, Any]:
    return dict(httpx.get(f"{c.base}/flows/{fid}", headers=headers).json()["data"])


def _executions(c: Cluster, fid: str) -> list[Any]:
    return _query(
        c.db_url,
        sa.select(Execution.input, Execution.status, Execution.trigger).where(Execution.flow_id == fid),
    )


def _stop(c: Cluster, headers: dict[str, str], fid: str) -> None:
    assert httpx.post(f"{c.base}/flows/{fid}/stop", headers=headers).status_code == 200
    _wait("the flow to stop", lambda: _status(c, headers, fid)["status"] == "inactive")
    assert not _query(c.db_url, sa.select(TriggerLease.flow_id).where(TriggerLease.flow_id == fid))


# -- AMQP --------------------------------------------------------------------------------


async def _amqp(fn: Callable[[Any], Any]) -> Any:
    connection = await aiormq.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        return await fn(channel)
    finally:
        await connection.close()


def _declare(queue: str, *, passive: bool = False) -> spec.Queue.DeclareOk:
    async def go(channel: Any) -> spec.Queue.DeclareOk:
        return await channel.queue_declare(queue, passive=passive, durable=not passive, auto_delete=False)

    return asyncio.run(_amqp(go))


def _publish(queue: str, items: list[tuple[str, bytes]]) -> None:
    async def go(channel: Any) -> None:
        await channel.confirm_delivery()
        for message_id, body in items:
            await channel.basic_publish(
                body,
                routing_key=queue,
                properties=spec.Basic.Properties(message_id=message_id, delivery_mode=2),
            )

    asyncio.run(_amqp(go))


def _delete_queue(queue: str) -> None:
    async def go(channel: Any) -> None:
        await channel.queue_delete(queue)

    asyncio.run(_amqp(go))


@pytest.fixture
def amqp_queue() -> Iterator[str]:
    require_server("RabbitMQ", 5672)
    name = f"flowyard-test-{uuid.uuid4().hex[:8]}"
    _declare(name)
    try:
        yield name
    finally:
        _delete_queue(name)


@pytest.fixture
def serve_pg(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """PostgreSQL: the API alone (`serve --no-engine`) and one `flowyard worker` consuming."""
    asyncio.run(_empty(postgres_url))
    c = Cluster(postgres_url, tmp_path)
    c.env["FLOWYARD_OUTBOUND_ALLOW_NETWORKS"] = "127.0.0.0/8"
    c.start("serve", "serve", "--no-engine")
    c.start("worker", "worker")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


def test_amqp_consume_end_to_end(serve: Cluster, amqp_queue: str) -> None:
    _amqp_end_to_end(serve, amqp_queue)


def test_amqp_consume_end_to_end_postgres(serve_pg: Cluster, amqp_queue: str) -> None:
    _amqp_end_to_end(serve_pg, amqp_queue, log="worker")


def _amqp_end_to_end(c: Cluster, amqp_queue: str, log: str = "serve") -> None:
    headers = _login(c)
    fid = _trigger_flow(
        c, headers, AMQP_URL, {"componentId": "amqp", "function": "consume", "fields": {"queue": amqp_queue}}
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    assert _declare(amqp_queue, passive=True).consumer_count == 1, "active only once subscribed"
    n = 20
    _publish(amqp_queue, [(f"m{i}", b'{"i": %d}' % i) for i in range(n)])
    # A redelivered message (same message-id, same body) finds its execution.
    _publish(amqp_queue, [(f"m{i}", b'{"i": %d}' % i) for i in range(5)])
    _publish(amqp_queue, [("", b"plain text")])  # no message-id: a digest names it
    rows = _wait(
        "every message to run",
        lambda: (r := _executions(c, fid)) and len(r) >= n + 1 and all(x[1] == "succeeded" for x in r) and r,
    )
    time.sleep(1)
    rows = _executions(c, fid)
    inputs = sorted(str(r[0]) for r in rows)
    assert len(rows) == n + 1, inputs
    assert sorted([*(str({"i": i}) for i in range(n)), "plain text"]) == inputs
    assert {r[2] for r in rows} == {"amqp"}
    _wait("the queue to drain", lambda: _declare(amqp_queue, passive=True).message_count == 0)

    _stop(c, headers, fid)
    assert _declare(amqp_queue, passive=True).consumer_count == 0, "the consumer is gone from the broker"
    _publish(amqp_queue, [("late", b'{"late": true}')])
    time.sleep(2)
    assert len(_executions(c, fid)) == n + 1, "no executions after the stop"
    assert _declare(amqp_queue, passive=True).message_count == 1, "the message waits in the queue"
    assert "Traceback" not in c.log(log), c.log(log)


# -- Redis -------------------------------------------------------------------------------


def _redis(fn: Callable[[aioredis.Redis], Any]) -> Any:
    async def go() -> Any:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.fixture
def stream() -> Iterator[str]:
    require_server("Redis", 6379)
    name = f"flowyard-test-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        _redis(lambda r: r.delete(name))


def test_redis_xread_end_to_end(serve: Cluster, stream: str) -> None:
    c = serve
    headers = _login(c)
    fid = _trigger_flow(
        c, headers, REDIS_URL, {"componentId": "redis", "function": "xread", "fields": {"key": stream}}
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    group = f"flowyard-{fid}"

    async def add(r: aioredis.Redis) -> None:
        for i in range(15):
            await r.xadd(stream, {"i": str(i), "name": f"n{i}"})

    _redis(add)
    rows = _wait(
        "every entry to run",
        lambda: (r := _executions(c, fid)) and len(r) >= 15 and all(x[1] == "succeeded" for x in r) and r,
    )
    time.sleep(1)
    rows = _executions(c, fid)
    assert sorted(r[0]["i"] for r in rows) == list(range(15)), "JSON values parsed, each entry once"
    assert {r[0]["name"] for r in rows} == {f"n{i}" for i in range(15)}
    _wait("nothing pending", lambda: _redis(lambda r: r.xpending(stream, group))["pending"] == 0)
    consumers = _redis(lambda r: r.xinfo_consumers(stream, group))
    assert [x["name"] for x in consumers] == [f"flowyard-{fid}".encode()]

    _stop(c, headers, fid)
    assert _redis(lambda r: r.xinfo_consumers(stream, group)) == [], "the consumer is gone"
    _redis(lambda r: r.xadd(stream, {"late": "1"}))
    time.sleep(2)
    assert len(_executions(c, fid)) == 15, "no executions after the stop"
    assert "Traceback" not in c.log("serve"), c.log("serve")


# -- MQTT --------------------------------------------------------------------------------


def _mqtt_publish(topic: str, payloads: list[bytes]) -> None:
    async def go() -> None:
        async with aiomqtt.Client("127.0.0.1", 1883, identifier=f"test-{uuid.uuid4().hex[:8]}") as client:
            for payload in payloads:
                await client.publish(topic, payload, qos=1)

    asyncio.run(go())


def test_mqtt_subscribe_end_to_end(serve: Cluster) -> None:
    require_server("Mosquitto", 1883)
    c = serve
    headers = _login(c)
    base = f"flowyard-test/{uuid.uuid4().hex[:8]}"
    fid = _trigger_flow(
        c,
        headers,
        MQTT_URL,
        {"componentId": "mqtt", "function": "subscribe", "fields": {"filter": f"{base}/+"}},
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    _mqtt_publish(f"{base}/a", [b'{"i": %d}' % i for i in range(10)])
    _mqtt_publish(f"{base}/b", [b"text"])
    _mqtt_publish(f"other/{base}", [b'{"never": true}'])
    rows = _wait(
        "every message to run",
        lambda: (r := _executions(c, fid)) and len(r) >= 11 and all(x[1] == "succeeded" for x in r) and r,
    )
    time.sleep(1)
    rows = _executions(c, fid)
    assert sorted(str(r[0]) for r in rows) == sorted([*(str({"i": i}) for i in range(10)), "text"])
    _stop(c, headers, fid)
    _mqtt_publish(f"{base}/a", [b'{"late": true}'])
    time.sleep(2)
    assert len(_executions(c, fid)) == 11, "no executions after the stop"
    assert "Traceback" not in c.log("serve"), c.log("serve")


# -- takeover ----------------------------------------------------------------------------


def _holder_pid(c: Cluster, fid: str) -> int | None:
    rows = _query(c.db_url, sa.select(TriggerLease.holder).where(TriggerLease.flow_id == fid))
    return int(rows[0][0].split(":")[1]) if rows and rows[0][0] else None


def test_sigkilled_consumer_is_taken_over_and_its_messages_run_once(tmp_path: Path, amqp_queue: str) -> None:
    """Two `serve` on one SQLite database. The database is write-locked from here while the
    messages arrive, so the consuming engine holds `prefetch` deliveries it cannot store (and
    so has not acknowledged) when it is SIGKILLed; the other engine takes the lease once it
    expires, the broker redelivers, and every message has one execution."""
    a = _sqlite_cluster(tmp_path)
    b = _sqlite_cluster(tmp_path)
    try:
        a.start("serve-a", "serve")
        a.wait_ready()
        b.start("serve-b", "serve")
        b.wait_ready()
        headers = _login(a)
        fid = _trigger_flow(
            a,
            headers,
            AMQP_URL,
            {"componentId": "amqp", "function": "consume", "fields": {"queue": amqp_queue, "prefetch": 10}},
        )
        _wait("the flow to become active", lambda: _status(a, headers, fid)["status"] == "active")
        victim = _holder_pid(a, fid)
        assert victim is not None
        lock = sqlite3.connect(tmp_path / "flowyard.db", isolation_level=None, timeout=30)
        lock.execute("BEGIN IMMEDIATE")
        try:
            _publish(amqp_queue, [(f"m{i}", b'{"i": %d}' % i) for i in range(30)])
            _wait(
                "the consumer to hold 10 deliveries",
                lambda: _declare(amqp_queue, passive=True).message_count == 20,
            )
            os.kill(victim, signal.SIGKILL)
            _wait(
                "the broker to requeue them", lambda: _declare(amqp_queue, passive=True).message_count == 30
            )
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # With one API process `serve` runs API and engine in one process: the victim may have
        # been a whole serve. The survivor answers from here on.
        a, b = (b, a) if a.procs["serve-a"].pid == victim else (a, b)
        rows = _wait(
            "every message to run",
            lambda: (r := _executions(a, fid)) and len(r) >= 30 and all(x[1] == "succeeded" for x in r) and r,
        )
        time.sleep(2)
        rows = _executions(a, fid)
        assert sorted(r[0]["i"] for r in rows) == list(range(30)), "each message executed once"
        taker = _holder_pid(a, fid)
        assert taker is not None and taker != victim
        assert _declare(amqp_queue, passive=True).consumer_count == 1
        _stop(a, headers, fid)
        assert _declare(amqp_queue, passive=True).consumer_count == 0
    finally:
        a.stop_all()
        b.stop_all()


def _kill_holder_and_time_takeover(c: Cluster, fid: str, amqp_queue: str) -> tuple[int, float]:
    """SIGKILL the engine holding the flow's AMQP consumer, publish one message at once and time
    how long until another engine has stored it; returns the victim's pid and the seconds."""
    _publish(amqp_queue, [("before", b'{"i": 0}')])
    _wait("the first message to be stored", lambda: len(_executions(c, fid)) == 1)
    victim = _holder_pid(c, fid)
    assert victim is not None
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _publish(amqp_queue, [("after", b'{"i": 1}')])
    _wait("another engine to store the message", lambda: len(_executions(c, fid)) == 2, seconds=30)
    took = time.monotonic() - killed
    print(f"trigger consumer taken over {took:.2f} s after the SIGKILL ({c.db_url.split(':')[0]})")
    assert took <= 10, f"taken over after {took:.1f} s: the lease expired, not the heartbeat"
    taker = _holder_pid(c, fid)
    assert taker is not None and taker != victim
    assert _declare(amqp_queue, passive=True).consumer_count == 1
    _wait("both to run", lambda: (r := _executions(c, fid)) and all(x[1] == "succeeded" for x in r))
    assert sorted(r[0]["i"] for r in _executions(c, fid)) == [0, 1]
    return victim, took


def test_sigkilled_consumer_is_taken_over_on_the_heartbeat_not_the_lease(
    tmp_path: Path, amqp_queue: str
) -> None:
    """The lease is 30 s here; the survivor sees the SIGKILLed holder's heartbeat stop (on SQLite
    at once: its pid is gone), frees its trigger leases in that transaction and takes the
    consumer over at once: a message published right after the kill is stored within seconds,
    by exactly one consumer."""
    a = _sqlite_cluster(tmp_path)
    b = _sqlite_cluster(tmp_path)
    for c in (a, b):
        c.env["FLOWYARD_LEASE_SECONDS"] = "30"
    try:
        a.start("serve-a", "serve")
        a.wait_ready()
        b.start("serve-b", "serve")
        b.wait_ready()
        headers = _login(a)
        fid = _trigger_flow(
            a,
            headers,
            AMQP_URL,
            {"componentId": "amqp", "function": "consume", "fields": {"queue": amqp_queue}},
        )
        _wait("the flow to become active", lambda: _status(a, headers, fid)["status"] == "active")
        victim, _took = _kill_holder_and_time_takeover(a, fid, amqp_queue)
        a, b = (b, a) if a.procs["serve-a"].pid == victim else (a, b)  # the survivor answers
        assert _status(a, headers, fid)["status"] == "active"
        _stop(a, headers, fid)
    finally:
        a.stop_all()
        b.stop_all()


def test_sigkilled_consumer_is_taken_over_on_the_heartbeat_postgres(
    postgres_url: str, tmp_path: Path, amqp_queue: str
) -> None:
    """PostgreSQL, two `flowyard worker`s beside the API: no pid shortcut across machines, the
    heartbeat timeout (3 s) decides, still far inside the 30 s lease."""
    asyncio.run(_empty(postgres_url))
    c = Cluster(postgres_url, tmp_path)
    c.env["FLOWYARD_OUTBOUND_ALLOW_NETWORKS"] = "127.0.0.0/8"
    c.env["FLOWYARD_LEASE_SECONDS"] = "30"
    try:
        c.start("serve", "serve", "--no-engine")
        c.start("worker-a", "worker")
        c.start("worker-b", "worker")
        c.wait_ready()
        headers = _login(c)
        fid = _trigger_flow(
            c,
            headers,
            AMQP_URL,
            {"componentId": "amqp", "function": "consume", "fields": {"queue": amqp_queue}},
        )
        _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
        _kill_holder_and_time_takeover(c, fid, amqp_queue)
        assert _status(c, headers, fid)["status"] == "active"
        _stop(c, headers, fid)
    finally:
        c.stop_all()


def test_sigkilled_redis_consumer_pending_entries_are_reread_once(tmp_path: Path, stream: str) -> None:
    """As above for a Redis stream: the dead holder's pending entries (read, never XACKed) are
    re-read by the next holder under the same consumer name."""
    a = _sqlite_cluster(tmp_path)
    b = _sqlite_cluster(tmp_path)
    try:
        a.start("serve-a", "serve")
        a.wait_ready()
        b.start("serve-b", "serve")
        b.wait_ready()
        headers = _login(a)
        fid = _trigger_flow(
            a,
            headers,
            REDIS_URL,
            {"componentId": "redis", "function": "xread", "fields": {"key": stream, "count": 10}},
        )
        _wait("the flow to become active", lambda: _status(a, headers, fid)["status"] == "active")
        group = f"flowyard-{fid}"
        victim = _holder_pid(a, fid)
        assert victim is not None
        lock = sqlite3.connect(tmp_path / "flowyard.db", isolation_level=None, timeout=30)
        lock.execute("BEGIN IMMEDIATE")
        try:

            async def add(r: aioredis.Redis) -> None:
                async with r.pipeline(transaction=True) as pipe:  # one MULTI: all 30 at once
                    for i in range(30):
                        pipe.xadd(stream, {"i": str(i)})
                    await pipe.execute()

            _redis(add)
            _wait(
                "the consumer to read 10 (count)",
                lambda: _redis(lambda r: r.xpending(stream, group))["pending"] == 10,
            )
            os.kill(victim, signal.SIGKILL)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # With one API process `serve` runs API and engine in one process: the victim may have
        # been a whole serve. The survivor answers from here on.
        a, b = (b, a) if a.procs["serve-a"].pid == victim else (a, b)
        _wait(
            "every entry to run",
            lambda: (r := _executions(a, fid)) and len(r) >= 30 and all(x[1] == "succeeded" for x in r) and r,
        )
        time.sleep(2)
        rows = _executions(a, fid)
        assert sorted(r[0]["i"] for r in rows) == list(range(30)), "each entry executed once"
        assert _holder_pid(a, fid) not in (None, victim)
        _wait("nothing pending", lambda: _redis(lambda r: r.xpending(stream, group))["pending"] == 0)
        _stop(a, headers, fid)
        assert _redis(lambda r: r.xinfo_consumers(stream, group)) == []
    finally:
        a.stop_all()
        b.stop_all()


def test_sigkilled_mqtt_consumer_messages_are_redelivered_once(tmp_path: Path) -> None:
    """As above for MQTT: the dead holder never sent PUBACK (its commits were blocked); the next
    holder resumes the persistent session (same client id) and the broker resends them."""
    require_server("Mosquitto", 1883)
    a = _sqlite_cluster(tmp_path)
    b = _sqlite_cluster(tmp_path)
    base = f"flowyard-test/{uuid.uuid4().hex[:8]}"
    try:
        a.start("serve-a", "serve")
        a.wait_ready()
        b.start("serve-b", "serve")
        b.wait_ready()
        headers = _login(a)
        fid = _trigger_flow(
            a,
            headers,
            MQTT_URL,
            {"componentId": "mqtt", "function": "subscribe", "fields": {"filter": f"{base}/#"}},
        )
        _wait("the flow to become active", lambda: _status(a, headers, fid)["status"] == "active")
        victim = _holder_pid(a, fid)
        assert victim is not None
        lock = sqlite3.connect(tmp_path / "flowyard.db", isolation_level=None, timeout=30)
        lock.execute("BEGIN IMMEDIATE")
        try:
            _mqtt_publish(f"{base}/x", [b'{"i": %d}' % i for i in range(10)])
            time.sleep(2)  # loopback delivery to the subscriber (not an assertion: see the end)
            os.kill(victim, signal.SIGKILL)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # With one API process `serve` runs API and engine in one process: the victim may have
        # been a whole serve. The survivor answers from here on.
        a, b = (b, a) if a.procs["serve-a"].pid == victim else (a, b)
        _wait(
            "every message to run",
            lambda: (r := _executions(a, fid)) and len(r) >= 10 and all(x[1] == "succeeded" for x in r) and r,
        )
        time.sleep(2)
        rows = _executions(a, fid)
        assert sorted(r[0]["i"] for r in rows) == list(range(10)), "each message executed once"
        assert _holder_pid(a, fid) not in (None, victim)
        _stop(a, headers, fid)
    finally:
        a.stop_all()
        b.stop_all()


def test_amqp_consumer_reconnects_and_says_why(serve: Cluster, amqp_queue: str) -> None:
    """The queue deleted under the consumer: the broker cancels it; the consumer retries with
    back-off, the flow's statusMessage says why; once the queue is back it subscribes again,
    the message clears, and messages run."""
    c = serve
    headers = _login(c)
    fid = _trigger_flow(
        c, headers, AMQP_URL, {"componentId": "amqp", "function": "consume", "fields": {"queue": amqp_queue}}
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    _delete_queue(amqp_queue)
    flow = _wait(
        "the problem in statusMessage",
        lambda: "NOT_FOUND" in ((f := _status(c, headers, fid))["statusMessage"] or "") and f,
    )
    assert flow["status"] == "active"
    assert flow["statusMessage"].startswith("amqp: reconnecting in "), flow
    assert "guest" not in flow["statusMessage"]
    _declare(amqp_queue)
    _wait("the consumer to come back", lambda: _declare(amqp_queue, passive=True).consumer_count == 1)
    _wait("statusMessage cleared", lambda: _status(c, headers, fid)["statusMessage"] is None)
    _publish(amqp_queue, [("after", b'{"after": true}')])
    _wait("the message to run", lambda: [r for r in _executions(c, fid) if r[1] == "succeeded"])
    assert [r[0] for r in _executions(c, fid)] == [{"after": True}]
    _stop(c, headers, fid)
