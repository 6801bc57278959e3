"""Issue 17: trigger payloads over FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES are refused before they are
read whole, each alone (logged, counted, settled the broker's way), and never block the messages
behind them; through a real `flowyard serve` and the real brokers (RabbitMQ 5672, Mosquitto 1883,
Redis 6379). Before the fix MQTT and Redis had no cap and AMQP checked 5 MiB after assembling."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiormq
import httpx
import pytest
import redis.asyncio as aioredis
from pamqp import commands as spec

from tests.connectors.conftest import require_server
from tests.connectors.test_triggers import (
    AMQP_URL,
    MQTT_URL,
    REDIS_URL,
    _amqp,
    _declare,
    _executions,
    _holder_pid,
    _mqtt_publish,
    _redis,
    _sqlite_cluster,
    _status,
    _stop,
    _trigger_flow,
    _wait,
    amqp_queue,  # noqa: F401 (fixture)
    stream,  # noqa: F401 (fixture)
)
from tests.engine.test_processes import Cluster, _login

pytestmark = [pytest.mark.slow]

CAP = 256 * 1024
BIG = 6 * 1024 * 1024  # over the cap, and over main's 5 MiB AMQP check


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Cluster]:
    c = _sqlite_cluster(tmp_path)
    c.env["FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES"] = str(CAP)
    c.start("serve", "serve")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    assert match, status
    return int(match.group(1)) * 1024


def _refusals(c: Cluster) -> list[str]:
    return [line for line in c.log("serve").splitlines() if "refused and dropped" in line]


def _says_size(line: str) -> bool:
    """The refusal names the cap's setting and the message's own size (at least BIG)."""
    match = re.search(r"of (\d+) bytes", line)
    return "FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES" in line and match is not None and int(match[1]) >= BIG


def _ran(c: Cluster, fid: str, n: int) -> list[object]:
    rows = _wait(
        f"{n} executions",
        lambda: (r := _executions(c, fid)) and len(r) >= n and all(x[1] == "succeeded" for x in r) and r,
    )
    time.sleep(1)
    return sorted(str(r[0]) for r in _executions(c, fid)) if rows else []


def test_amqp_message_over_the_cap_is_rejected_alone_unread(capped: Cluster, amqp_queue: str) -> None:  # noqa: F811
    require_server("RabbitMQ", 5672)
    c = capped
    headers = _login(c)
    fid = _trigger_flow(
        c, headers, AMQP_URL, {"componentId": "amqp", "function": "consume", "fields": {"queue": amqp_queue}}
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    pid = _holder_pid(c, fid)
    assert pid is not None
    before = _peak_rss(pid)

    async def go(channel: aiormq.abc.AbstractChannel) -> None:
        for i, body in enumerate(
            [b'{"i": 0}', b'"' + b"x" * BIG + b'"', b'{"i": 2}', b"y" * BIG, b'{"i": 4}']
        ):
            props = spec.Basic.Properties(message_id=f"m{i}", delivery_mode=2)
            await channel.basic_publish(body, routing_key=amqp_queue, properties=props)

    asyncio.run(_amqp(go))
    assert _ran(c, fid, 3) == ["{'i': 0}", "{'i': 2}", "{'i': 4}"]
    _wait("the queue to drain", lambda: _declare(amqp_queue, passive=True).message_count == 0)
    refusals = _wait("two refusals logged", lambda: len(r := _refusals(c)) >= 2 and r)
    assert len(refusals) == 2, refusals
    assert all(_says_size(line) for line in refusals), refusals
    # The bodies were skipped frame by frame, never assembled (nor decoded, nor stored).
    assert _peak_rss(pid) - before < BIG, (before, _peak_rss(pid))
    _stop(c, headers, fid)
    assert "Traceback" not in c.log("serve"), c.log("serve")


def test_redis_entry_over_the_cap_is_never_sent_to_the_engine(capped: Cluster, stream: str) -> None:  # noqa: F811
    c = capped
    headers = _login(c)
    fid = _trigger_flow(
        c, headers, REDIS_URL, {"componentId": "redis", "function": "xread", "fields": {"key": stream}}
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    pid = _holder_pid(c, fid)
    assert pid is not None
    before = _peak_rss(pid)
    group = f"flowyard-{fid}"

    async def add(r: aioredis.Redis) -> None:
        await r.xadd(stream, {"i": "0"})
        for _ in range(3):  # the attack: three big entries (40 MB there)
            await r.xadd(stream, {"blob": "z" * BIG})
        await r.xadd(stream, {"i": "4"})

    _redis(add)
    assert _ran(c, fid, 2) == ["{'i': 0}", "{'i': 4}"]
    _wait("nothing pending", lambda: _redis(lambda r: r.xpending(stream, group))["pending"] == 0)
    refusals = _wait("three refusals logged", lambda: len(r := _refusals(c)) >= 3 and r)
    assert len(refusals) == 3, refusals
    assert all(_says_size(line) for line in refusals), refusals
    assert _peak_rss(pid) - before < BIG, (before, _peak_rss(pid))
    _stop(c, headers, fid)
    assert "Traceback" not in c.log("serve"), c.log("serve")


def test_mqtt_message_over_the_cap_is_dropped_alone_unread(capped: Cluster) -> None:
    require_server("Mosquitto", 1883)
    c = capped
    headers = _login(c)
    base = f"flowyard-test/{uuid.uuid4().hex[:8]}"
    fid = _trigger_flow(
        c,
        headers,
        MQTT_URL,
        {"componentId": "mqtt", "function": "subscribe", "fields": {"filter": f"{base}/+"}},
    )
    _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")
    pid = _holder_pid(c, fid)
    assert pid is not None
    before = _peak_rss(pid)
    just_under = b'"' + b"u" * (CAP - 2 - 64) + b'"'  # within the cap: read and run as usual
    # Within the cap on the wire, but twice the cap as JSON text (every backslash escaped): the
    # consumer's own check on the decoded data refuses it.
    escapes = b"\\" * (CAP // 2 + 10)
    big = [b"x" * BIG, b"y" * BIG]
    _mqtt_publish(f"{base}/a", [b'{"i": 0}', big[0], b'{"i": 2}', big[1], just_under, escapes, b'{"i": 5}'])
    ran = _ran(c, fid, 4)
    assert ran == sorted(["{'i': 0}", "{'i': 2}", "{'i': 5}", "u" * (CAP - 2 - 64)])
    refusals = _wait("three refusals logged", lambda: len(r := _refusals(c)) >= 3 and r)
    assert len(refusals) == 3, refusals
    assert sum(_says_size(line) for line in refusals) == 2, refusals
    assert sum(f"bytes as JSON, over {CAP}" in line for line in refusals) == 1, refusals
    assert _peak_rss(pid) - before < BIG, (before, _peak_rss(pid))
    _stop(c, headers, fid)
    # Acknowledged (PUBACK): the persistent session does not resend them when the flow starts again.
    assert httpx.post(f"{c.base}/flows/{fid}/start", headers=headers).status_code == 200
    _wait("the flow to become active again", lambda: _status(c, headers, fid)["status"] == "active")
    _mqtt_publish(f"{base}/a", [b'{"i": 6}'])
    assert len(_ran(c, fid, 5)) == 5
    time.sleep(2)
    assert len(_executions(c, fid)) == 5 and len(_refusals(c)) == 3, _refusals(c)
    _stop(c, headers, fid)
    assert "Traceback" not in c.log("serve"), c.log("serve")
