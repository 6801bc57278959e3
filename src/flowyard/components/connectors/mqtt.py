"""The ``mqtt`` component: publish with QoS 0 or 1 (aiomqtt over paho-mqtt).

The client keeps the credential's host name (TLS verifies the certificate
against it) but its socket goes to the address the network policy vetted: paho's
socket factory is replaced on the instance, so no second lookup and no proxy
environment is used. One connection per credential and runner process, closed when
unused.

aiomqtt and paho are imported by the functions that talk to a broker, on first use: a
process that only lists or validates components (the API) or runs flows without mqtt
steps never loads them (``tests/unit/test_lazy_imports.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import socket
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field, field_validator

from flowyard.components.builtins import ComponentError, _Fields, _render_url, passthrough
from flowyard.components.connectors.amqp import decode_body
from flowyard.components.connectors.common import (
    Pools,
    as_bytes,
    check_mapper,
    credential_key,
    credential_url,
    render,
    size_text,
    tls_context,
    vet_host,
)
from flowyard.components.context import StepContext
from flowyard.components.events import Event, TriggerContext
from flowyard.components.registry import Component, Message

if TYPE_CHECKING:
    import aiomqtt

_SCHEMES = {"mqtt": 1883, "mqtts": 8883}


class MqttPublishFields(_Fields):
    topic: str | None = Field(
        None, min_length=1, max_length=1024, description="publish: the topic; may hold {{ JSONata }}."
    )
    filter: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="subscribe (trigger): the topic filter (+ and # allowed), subscribed with QoS 1.",
    )
    payload: Any = Field(None, description="Mapper (JSONata leaves) for the payload; default: the data.")
    qos: Literal[0, 1] = Field(1, description="0: at most once; 1: the broker acknowledged it (PUBACK).")
    retain: bool = False
    timeout: float = Field(30.0, gt=0, le=300, description="Connect and acknowledgement timeout, seconds.")

    _payload = field_validator("payload")(check_mapper)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None and "{{" not in value and ("+" in value or "#" in value):
            raise ValueError("a publish topic may not contain the wildcards + or #")
        return value


async def _connect(credentials: dict[str, Any], ctx: StepContext, seconds: float, key: str) -> aiomqtt.Client:
    import aiomqtt

    ep = credential_url(credentials, "mqtt", _SCHEMES)
    address = await vet_host(ctx.settings, ep.host, ep.port, within=seconds)
    client = aiomqtt.Client(
        hostname=ep.host,
        port=ep.port,
        username=ep.username,
        password=ep.password,
        identifier=f"flowyard-{uuid.uuid4().hex[:16]}",
        tls_context=tls_context(credentials) if ep.scheme == "mqtts" else None,
        timeout=seconds,
        keepalive=30,
    )
    paho = client._client

    def vetted_socket() -> socket.socket:
        return socket.create_connection((address, ep.port), timeout=seconds)

    paho._create_socket_connection = vetted_socket  # type: ignore[method-assign]
    await client.__aenter__()

    def lost(future: asyncio.Future[None]) -> None:
        # The broker went away: drop this connection from the pool (the next step reconnects)
        # and take the future's exception so it is not reported as never retrieved.
        if not future.cancelled():
            future.exception()
        task = asyncio.get_running_loop().create_task(_POOLS.discard(key, client))
        _CLEANUPS.add(task)
        task.add_done_callback(_CLEANUPS.discard)

    client._disconnected.add_done_callback(lost)
    return client


async def _close(client: aiomqtt.Client) -> None:
    await client.__aexit__(None, None, None)


_POOLS: Pools[aiomqtt.Client] = Pools(_close)
_CLEANUPS: set[asyncio.Task[None]] = set()


async def publish(message: Message, ctx: StepContext) -> Message:
    import aiomqtt

    f: MqttPublishFields = ctx.fields
    data = message["data"]
    if f.topic is None:
        raise ComponentError("mqtt publish: the 'topic' field is required")
    topic = _render_url(f.topic, data) if "{{" in f.topic else f.topic
    if not topic or "+" in topic or "#" in topic:
        raise ComponentError(f"mqtt: {topic!r} is not a topic to publish to")
    payload = as_bytes(data if f.payload is None else render(f.payload, data))
    creds = ctx.credentials or {}
    key = credential_key("mqtt", creds, ctx.settings)
    try:
        async with (
            asyncio.timeout(f.timeout),
            _POOLS.use(
                key, lambda: _connect(creds, ctx, f.timeout, key), ctx.settings.connector_idle_seconds
            ) as client,
        ):
            await client.publish(topic, payload, qos=f.qos, retain=f.retain, timeout=f.timeout)
    except TimeoutError:
        await _POOLS.discard(key)
        raise ComponentError(f"mqtt: no acknowledgement within {f.timeout:g} s") from None
    except (aiomqtt.MqttError, OSError) as exc:
        await _POOLS.discard(key)
        raise ComponentError(f"mqtt: {type(exc).__name__}: {exc}") from None
    return {"data": data, "metadata": {**message["metadata"], "mqtt": {"topic": topic, "qos": f.qos}}}


_PUBLISH = 0x30
_CHUNK = 65536


class _PayloadGuard:
    """Wraps paho's ``_sock_recv`` on one client: a PUBLISH whose payload is over ``cap`` is read
    off the socket in 64 KiB chunks and dropped, never assembled. paho gets the packet's
    variable header (topic, packet id) followed by ``marker`` and the payload's size instead, so
    it delivers (and later acknowledges) the message as usual with that stand-in payload.

    paho has no client-side maximum packet size (MQTT 5's Maximum Packet Size asks the broker to
    drop such messages silently; this works on 3.1.1 as well, and the consumer logs each one).
    The fixed header (type, remaining length) is read by paho; this takes over at the first
    payload read, from the still unread remaining length."""

    def __init__(self, paho: Any, cap: int, marker: bytes) -> None:
        self.paho = paho
        self.recv = paho._sock_recv
        self.cap = cap
        self.marker = marker
        self.head: bytearray | None = None  # not None while this guard reads a packet
        self.keep: bool | None = None  # decided once the variable header is read
        self.body = bytearray()
        self.left = 0

    def __call__(self, bufsize: int) -> bytes:
        packet = self.paho._in_packet
        if self.head is None:
            if not (
                packet["have_remaining"]
                and packet["command"] & 0xF0 == _PUBLISH
                and packet["remaining_length"] > self.cap
                and packet["to_process"] == packet["remaining_length"]
                and not packet["packet"]
            ):
                return cast(bytes, self.recv(bufsize))
            self.head, self.keep, self.body = bytearray(), None, bytearray()
            self.left = packet["remaining_length"]
        try:
            return self._publish(packet)
        except _Lost:
            return b""

    def _publish(self, packet: dict[str, Any]) -> bytes:
        head = self.head
        assert head is not None
        qos = (packet["command"] & 0x06) >> 1
        while self.keep is None:
            want = 2 if len(head) < 2 else 2 + int.from_bytes(head[:2], "big") + (2 if qos else 0)
            if len(head) >= want or self.left <= 0:
                self.keep = self.left <= self.cap
                break
            data = self._read(min(want - len(head), self.left))
            head += data
            self.left -= len(data)
        while self.left > 0:
            data = self._read(min(self.left, _CHUNK))
            self.left -= len(data)
            if self.keep:
                self.body += data
        size = packet["remaining_length"] - len(head)
        out = bytes(head) + (bytes(self.body) if self.keep else self.marker + str(size).encode())
        self.head, self.keep, self.body = None, None, bytearray()
        packet["to_process"] = len(out)  # paho subtracts what this returns: the packet is complete
        return out

    def _read(self, n: int) -> bytes:
        data = cast(bytes, self.recv(n))  # BlockingIOError: paho calls again, the state is kept
        if not data:  # the connection is lost (paho sees the empty read)
            self.head, self.keep, self.body = None, None, bytearray()
            raise _Lost
        return data


class _Lost(Exception):
    pass


async def subscribe_events(ctx: TriggerContext) -> AsyncIterator[Event]:
    """The ``subscribe`` trigger: a persistent session (clean_session false, client id
    ``flowyard-<flow id>`` whichever process holds the lease), QoS 1, PUBACK sent only after the
    execution is stored (paho's manual acknowledgements), so the broker redelivers what was not
    acknowledged when the consumer died, and queues messages while the flow is stopped."""
    import aiomqtt
    import paho.mqtt.client as paho_mqtt

    f: MqttPublishFields = ctx.fields
    if not f.filter:
        raise ComponentError("mqtt subscribe: the 'filter' field is required")
    ep = credential_url(ctx.credentials, "mqtt", _SCHEMES)
    address = await vet_host(ctx.settings, ep.host, ep.port, within=f.timeout)
    client = aiomqtt.Client(
        hostname=ep.host,
        port=ep.port,
        username=ep.username,
        password=ep.password,
        identifier=f"flowyard-{ctx.flow_id}",
        clean_session=False,
        tls_context=tls_context(ctx.credentials) if ep.scheme == "mqtts" else None,
        timeout=f.timeout,
        keepalive=30,
    )
    paho = client._client

    def vetted_socket() -> socket.socket:
        return socket.create_connection((address, ep.port), timeout=f.timeout)

    paho._create_socket_connection = vetted_socket  # type: ignore[method-assign]
    paho.manual_ack_set(True)
    cap = ctx.settings.max_trigger_payload_bytes
    # A payload no publisher can send: the guard's stand-in for one it dropped.
    marker = b"\x00flowyard-oversize:" + secrets.token_hex(16).encode() + b":"
    # The guard knows MQTT 3.1.1's PUBLISH layout (no properties), the version aiomqtt speaks here.
    assert paho._protocol == paho_mqtt.MQTTv311
    paho._sock_recv = _PayloadGuard(paho, cap, marker)  # type: ignore[method-assign]
    try:
        async with client:
            await client.subscribe(f.filter, qos=1, timeout=f.timeout)
            await ctx.subscribed()
            async for message in client.messages:
                payload = message.payload
                raw = payload if isinstance(payload, bytes) else str(payload).encode()
                topic = message.topic.value
                # MQTT has no message id: the packet id (mid) is reused within a session and
                # across sessions. A redelivery keeps its topic, mid and payload, so their digest
                # names it; a new message equal in all three within the idempotency window (24 h)
                # is taken for a redelivery (documented in docs/components.md).
                digest = hashlib.sha256(f"{topic}\0{message.mid}\0".encode() + raw).hexdigest()
                qos = message.qos

                async def ack(mid: int = message.mid, qos: int = qos) -> None:
                    if qos > 0:
                        paho.ack(mid, qos)

                if raw.startswith(marker):
                    yield Event(
                        id=f"sha256:{digest}",
                        data=None,
                        ack=ack,
                        refused=f"mqtt message of {int(raw[len(marker) :])} bytes on {topic!r}, over "
                        f"{size_text(cap)} (FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES)",
                    )
                    continue
                yield Event(id=f"sha256:{digest}", data=decode_body(raw), ack=ack)
    except aiomqtt.MqttError as exc:
        raise ComponentError(f"mqtt: {type(exc).__name__}: {exc}") from None


COMPONENT = Component(
    id="mqtt",
    description="MQTT: publish with QoS 0/1. Credentials: {url} (mqtt://user:pw@host:1883 or mqtts://...), "
    "optional {password}, {ca} (PEM).",
    functions={"publish": publish, "subscribe": passthrough},
    default_function="publish",
    fields=MqttPublishFields,
    events={"subscribe": subscribe_events},
    function_descriptions={
        "subscribe": "Trigger: one execution per message on `filter` (input: the JSON payload, else its "
        "text); acknowledged (PUBACK) once the execution is stored.",
        "publish": "Publish the payload to a topic (QoS 1: once the broker acknowledged); passes the "
        "message on with metadata.mqtt.",
    },
)
