"""The mqtt component against the real Mosquitto on this machine (and one the test starts with a
password file, for the bad-credentials case)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import IN_CI
from tests.connectors.conftest import REGISTRY, outputs, require_server, step, step_error
from tests.engine.test_processes import _free_port

CREDS = {"url": "mqtt://127.0.0.1:1883"}


async def test_publish_qos1_reaches_a_subscriber(http: httpx.AsyncClient, settings: Settings) -> None:
    require_server("Mosquitto", 1883)
    topic = f"flowyard-test/{uuid.uuid4().hex[:10]}/orders"
    async with aiomqtt.Client("127.0.0.1", 1883) as sub:
        await sub.subscribe(topic, qos=1)
        for qos in (0, 1):
            fields = {"topic": "flowyard-test/{{ run }}/orders", "payload": {"id": "id"}, "qos": qos}
            out = await step(
                http, settings, "mqtt", "publish", fields, CREDS, {"id": qos, "run": topic.split("/")[1]}
            )
            assert outputs(out) == [{"id": qos, "run": topic.split("/")[1]}]
        got = []
        async with asyncio.timeout(10):
            async for message in sub.messages:
                got.append((str(message.topic), message.payload))
                if len(got) == 2:
                    break
    assert sorted(got) == [(topic, b'{"id":0}'), (topic, b'{"id":1}')]


async def test_wildcards_are_not_publish_topics(http: httpx.AsyncClient, settings: Settings) -> None:
    component = REGISTRY.get("mqtt")
    assert component is not None
    assert component.validate_fields({"topic": "a/#"})[0][0] == ".topic"
    error = step_error(
        await step(http, settings, "mqtt", "publish", {"topic": "{{ t }}"}, CREDS, {"t": "a/+/b"})
    )
    assert "is not a topic to publish to" in error


@pytest.fixture
def mosquitto_with_passwords(tmp_path: Path) -> Iterator[int]:
    """A Mosquitto the test starts: anonymous refused, one user 'flow' with password 'right'."""
    broker = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if broker is None or shutil.which("mosquitto_passwd") is None:
        if IN_CI:
            pytest.fail("mosquitto and mosquitto_passwd are required in CI")
        pytest.skip("mosquitto is not installed")
    passwords = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "flow", "right"], check=True)
    port = _free_port()
    conf = tmp_path / "mosquitto.conf"
    # As root, mosquitto would switch to its own user, which cannot read pytest's private tmp dirs.
    keep_user = "user root\n" if os.getuid() == 0 else ""
    conf.write_text(
        f"{keep_user}listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {passwords}\n"
    )
    proc = subprocess.Popen([broker, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"mosquitto did not start: {proc.stderr.read().decode() if proc.stderr else ''}"
                    ) from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def test_errors_bad_credentials_closed_port_timeout_policy(
    http: httpx.AsyncClient,
    settings: Settings,
    closed_settings: Settings,
    silent_port: int,
    mosquitto_with_passwords: int,
) -> None:
    port = mosquitto_with_passwords
    fields = {"topic": "t", "timeout": 5}
    good = {"url": f"mqtt://flow:right@127.0.0.1:{port}"}
    assert (await step(http, settings, "mqtt", "publish", fields, good)).status == "succeeded"
    error = step_error(
        await step(http, settings, "mqtt", "publish", fields, {"url": f"mqtt://flow:nope@127.0.0.1:{port}"})
    )
    assert (
        error.startswith("mqtt: ")
        and "nope" not in error
        and ("authori" in error.lower() or "credentials" in error.lower())
    ), error
    closed = {"url": f"mqtt://127.0.0.1:{_free_port()}"}
    error = step_error(await step(http, settings, "mqtt", "publish", {"topic": "t", "timeout": 3}, closed))
    assert error.startswith("mqtt: ") and "refused" in error.lower(), error
    silent = {"url": f"mqtt://127.0.0.1:{silent_port}"}
    error = step_error(await step(http, settings, "mqtt", "publish", {"topic": "t", "timeout": 0.5}, silent))
    assert error == "mqtt: no acknowledgement within 0.5 s", error
    error = step_error(await step(http, closed_settings, "mqtt", "publish", {"topic": "t"}, CREDS))
    assert "refusing to connect to 127.0.0.1" in error


class _Wire:
    """paho's side of the guard: the packet state paho keeps and a socket that hands out at most
    ``piece`` bytes per read and raises BlockingIOError every other read (non-blocking)."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.data = data
        self.piece = piece
        self.reads = 0
        self.asked = 0
        self._in_packet: dict[str, Any] = {}

    def _sock_recv(self, n: int) -> bytes:
        self.asked = max(self.asked, n)
        self.reads += 1
        if self.reads % 2:
            raise BlockingIOError
        out, self.data = self.data[: min(n, self.piece)], self.data[min(n, self.piece) :]
        return out


def _paho_reads(wire: _Wire, recv: Any, command: int, remaining: int) -> bytes:
    """paho's _packet_read after the fixed header: read until to_process is 0."""
    wire._in_packet = {
        "command": command,
        "have_remaining": 1,
        "remaining_length": remaining,
        "to_process": remaining,
        "packet": bytearray(),
    }
    packet = wire._in_packet
    while packet["to_process"] > 0:
        try:
            data = recv(packet["to_process"])
        except BlockingIOError:
            continue
        assert data, "connection lost"
        packet["to_process"] -= len(data)
        packet["packet"] += data
    return bytes(packet["packet"])


def test_payload_guard_drops_an_oversize_publish_piece_by_piece() -> None:
    from flowyard.components.connectors.mqtt import _PayloadGuard

    topic = b"site/1/temp"
    head = len(topic).to_bytes(2, "big") + topic + (513).to_bytes(2, "big")  # QoS 1: packet id
    payload = b"p" * 1_000_000
    wire = _Wire(head + payload + b"NEXT", piece=4096)
    guard = _PayloadGuard(wire, 64 * 1024, b"\x00marker:")
    packet = _paho_reads(wire, guard, 0x32, len(head) + len(payload))
    assert packet == head + b"\x00marker:" + str(len(payload)).encode()
    assert wire.data == b"NEXT", "exactly this packet was consumed"
    assert wire.asked <= 65536, "read in pieces, never asked for the whole payload"
    # Within the cap (or not a PUBLISH) the bytes pass through unchanged.
    small = head + b"s" * 1000
    wire = _Wire(small, piece=100)
    guard = _PayloadGuard(wire, 64 * 1024, b"\x00marker:")
    assert _paho_reads(wire, guard, 0x32, len(small)) == small
    # A QoS 0 publish has no packet id; a payload just under the cap after a long topic is kept.
    topic0 = b"t" * 300
    head0 = len(topic0).to_bytes(2, "big") + topic0
    body = b"k" * (64 * 1024 - 1)
    wire = _Wire(head0 + body, piece=5000)
    guard = _PayloadGuard(wire, 64 * 1024, b"\x00marker:")
    assert _paho_reads(wire, guard, 0x30, len(head0) + len(body)) == head0 + body
