"""The ``amqp`` component (RabbitMQ): publish with persistent delivery and publisher confirms.

It speaks AMQP 0-9-1 through aiormq (the protocol library under aio-pika), because
aiormq lets the connection go to the address the network policy vetted while TLS
still checks the certificate against the credential's host name. One connection
and one confirming channel per credential and runner process, closed when unused.

aiormq and pamqp are imported by the functions that talk to a broker, on first use: a
process that only lists or validates components (the API) or runs flows without amqp
steps never loads them (``tests/unit/test_lazy_imports.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, unquote

import orjson
from pydantic import Field, field_validator

from flowyard import jsonvalue
from flowyard.components.builtins import ComponentError, _Fields, _render_url, passthrough
from flowyard.components.connectors.common import (
    Pools,
    as_bytes,
    check_expression,
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
    from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage
    from pamqp.header import ContentHeader

log = logging.getLogger(__name__)

_SCHEMES = {"amqp": 5672, "amqps": 5671}
_INBOX_BYTES = 64 * 1024 * 1024


class AmqpPublishFields(_Fields):
    exchange: str = Field("", max_length=255, description="Exchange; '' is the default exchange.")
    routingKey: str = Field(
        "",
        max_length=255,
        description="Routing key (the queue, on the default exchange); may hold {{ JSONata }}.",
    )
    body: Any = Field(None, description="Mapper (JSONata leaves) for the body; default: the message data.")
    messageId: str | None = Field(
        None, description="JSONata for the AMQP message-id; default: <executionId>:<nodeId>:<n>."
    )
    headers: dict[str, str] = Field(default_factory=dict, description="AMQP headers (constants).")
    persistent: bool = Field(True, description="delivery_mode 2: the broker writes it to disk.")
    mandatory: bool = Field(True, description="Fail the step when no queue is bound to take the message.")
    timeout: float = Field(30.0, gt=0, le=300, description="Connect and confirm timeout, seconds.")
    queue: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="consume (trigger): the queue to consume (it must exist).",
    )
    prefetch: int = Field(
        10, ge=1, le=1000, description="consume: unacknowledged deliveries the broker sends ahead."
    )

    _body = field_validator("body")(check_mapper)
    _id = field_validator("messageId")(check_expression)


class _Link:
    """A connection and its confirming channel (reopened when the broker closed it)."""

    def __init__(self, connection: AbstractConnection) -> None:
        self.connection = connection
        self.channel: AbstractChannel | None = None
        self.lock = asyncio.Lock()

    async def confirming_channel(self) -> AbstractChannel:
        async with self.lock:
            if self.channel is None or self.channel.is_closed:
                self.channel = await self.connection.channel(publisher_confirms=True)
            return self.channel


async def _connect(credentials: dict[str, Any], ctx: StepContext, seconds: float) -> _Link:
    import aiormq

    ep = credential_url(credentials, "amqp", _SCHEMES)
    address = await vet_host(ctx.settings, ep.host, ep.port, within=seconds)
    host = f"[{address}]" if ":" in address else address
    auth = f"{quote(ep.username or 'guest', safe='')}:{quote(ep.password or '', safe='')}@"
    vhost = quote(unquote(ep.path[1:]) if len(ep.path) > 1 else "/", safe="")
    # Only parameters we choose go into the URL (aiormq reads cafile/certfile/... from it).
    url = f"{ep.scheme}://{auth}{host}:{ep.port}/{vhost}?heartbeat=30&name=flowyard"
    kwargs: dict[str, Any] = {}
    if ep.scheme == "amqps":
        kwargs = {"context": tls_context(credentials), "server_hostname": ep.host}
    connection = await asyncio.wait_for(aiormq.connect(url, **kwargs), seconds)
    return _Link(connection)


async def _close(link: _Link) -> None:
    await link.connection.close()


_POOLS: Pools[_Link] = Pools(_close)


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def publish(message: Message, ctx: StepContext) -> Message:
    import aiormq
    from pamqp import commands as spec

    f: AmqpPublishFields = ctx.fields
    data = message["data"]
    body = as_bytes(data if f.body is None else render(f.body, data))
    routing_key = _render_url(f.routingKey, data) if "{{" in f.routingKey else f.routingKey
    if f.messageId is not None:
        message_id = str(render(f.messageId, data))
    elif ctx.idempotency_key:  # the same on every retry and redelivery of this step (SPEC §11)
        message_id = ctx.idempotency_key
    else:
        index = message["metadata"].get("splitIndex", 0)
        message_id = f"{ctx.execution_id}:{ctx.node_id}:{index}"
    properties = spec.Basic.Properties(
        content_type="application/json" if f.body is not None or not isinstance(data, str) else "text/plain",
        delivery_mode=2 if f.persistent else 1,
        message_id=message_id,
        headers=dict(f.headers) or None,
        app_id="flowyard",
    )
    creds = ctx.credentials or {}
    key = credential_key("amqp", creds, ctx.settings)
    try:
        async with (
            asyncio.timeout(f.timeout),
            _POOLS.use(
                key, lambda: _connect(creds, ctx, f.timeout), ctx.settings.connector_idle_seconds
            ) as link,
        ):
            if link.connection.is_closed:
                raise aiormq.exceptions.ConnectionClosed(320, "connection closed")
            channel = await link.confirming_channel()
            confirmation = await channel.basic_publish(
                body,
                exchange=f.exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=f.mandatory,
            )
    except TimeoutError:
        await _POOLS.discard(key)
        raise ComponentError(f"amqp: no confirmation within {f.timeout:g} s") from None
    except aiormq.exceptions.PublishError:
        raise ComponentError(
            f"amqp: no queue took the message (exchange {f.exchange!r}, routing key {routing_key!r})"
        ) from None
    except aiormq.exceptions.ChannelClosed as exc:
        raise ComponentError(f"amqp: the broker refused the publish: {_error(exc)}") from None
    except (aiormq.exceptions.AMQPError, OSError) as exc:
        await _POOLS.discard(key)
        raise ComponentError(f"amqp: {_error(exc)}") from None
    if not isinstance(confirmation, spec.Basic.Ack):
        raise ComponentError(f"amqp: the broker did not confirm the message ({type(confirmation).__name__})")
    meta = {
        **message["metadata"],
        "amqp": {"exchange": f.exchange, "routingKey": routing_key, "messageId": message_id},
    }
    return {"data": data, "metadata": meta}


def decode_body(body: bytes) -> Any:
    """A broker payload as execution input: JSON when it parses (within the depth limit,
    ``flowyard.jsonvalue``), else UTF-8 text."""
    try:
        return jsonvalue.loads(body)
    except (orjson.JSONDecodeError, jsonvalue.TooDeep):
        return body.decode("utf-8", errors="replace")


def _skip_bodies_over(channel: AbstractChannel, cap: int) -> None:
    """Deliveries whose content header announces a body over ``cap`` have their body frames read
    and dropped one by one (each at most the negotiated frame_max, RabbitMQ's 128 KiB), never
    assembled: the consumer sees the delivery with an empty body and the header's body_size.
    aiormq assembles bodies in ``Channel._read_content``; this wraps it on this channel only."""
    from aiormq.abc import DeliveredMessage
    from pamqp import commands as spec
    from pamqp.body import ContentBody

    read_content = channel._read_content  # type: ignore[attr-defined]

    async def bounded(frame: Any, header: ContentHeader) -> DeliveredMessage:
        if not isinstance(frame, spec.Basic.Deliver) or (header.body_size or 0) <= cap:
            return cast(DeliveredMessage, await read_content(frame, header))
        left = header.body_size or 0
        while left > 0:
            content = await channel._get_frame()  # type: ignore[attr-defined]
            if not isinstance(content, ContentBody):
                raise ValueError(f"Unexpected frame {content!r}")
            left -= len(content.value)
        return DeliveredMessage(delivery=frame, header=header, body=b"", channel=channel)

    channel._read_content = bounded  # type: ignore[attr-defined]


async def consume_events(ctx: TriggerContext) -> AsyncIterator[Event]:
    """The ``consume`` trigger: manual acknowledgements, at most ``prefetch`` unacknowledged
    deliveries; closing the iterator cancels the consumer and closes the connection (the broker
    requeues what was not acknowledged)."""
    import aiormq
    from pamqp import commands as spec

    f: AmqpPublishFields = ctx.fields
    if not f.queue:
        raise ComponentError("amqp consume: the 'queue' field is required")
    cap = ctx.settings.max_trigger_payload_bytes
    link = await _connect(ctx.credentials or {}, cast(StepContext, ctx), f.timeout)
    connection = link.connection
    try:
        channel = await connection.channel()
        _skip_bodies_over(channel, cap)
        # Deliveries sent ahead wait here in memory: at most _INBOX_BYTES of them, however large
        # prefetch and the cap are (RabbitMQ does not implement basic.qos prefetch_size).
        await channel.basic_qos(prefetch_count=max(1, min(f.prefetch, _INBOX_BYTES // cap)))
        inbox: asyncio.Queue[DeliveredMessage] = asyncio.Queue()

        async def deliver(message: DeliveredMessage) -> None:
            inbox.put_nowait(message)

        consumer_tag = f"flowyard-{ctx.flow_id}"
        try:
            await channel.basic_consume(f.queue, deliver, no_ack=False, consumer_tag=consumer_tag)
        except aiormq.exceptions.ChannelClosed as exc:
            raise ComponentError(f"amqp: cannot consume from {f.queue!r}: {_error(exc)}") from None
        await ctx.subscribed()
        while True:
            get = asyncio.ensure_future(inbox.get())
            while not get.done():
                await asyncio.wait(
                    {get, channel.closing, connection.closing}, timeout=2, return_when=asyncio.FIRST_COMPLETED
                )
                if get.done():
                    break
                if channel.is_closed or connection.is_closed:
                    get.cancel()
                    raise ComponentError("amqp: the broker closed the consumer's channel")
                # The broker cancels a consumer whose queue was deleted (basic.cancel): aiormq drops it.
                if consumer_tag not in getattr(channel, "consumers", {consumer_tag: None}):
                    get.cancel()
                    raise ComponentError(f"amqp: the broker cancelled the consumer of {f.queue!r}")
            message = get.result()
            delivery = message.delivery
            assert isinstance(delivery, spec.Basic.Deliver)
            tag = delivery.delivery_tag or 0
            body = message.body
            size = message.header.body_size or 0
            if size > cap or len(body) > cap:
                # Its body frames were skipped unread (_skip_bodies_over). Rejected without requeue
                # once the consumer logged it: the broker drops it, or dead-letters it if the queue
                # has a dead-letter exchange.
                async def reject(tag: int = tag) -> None:
                    await channel.basic_reject(tag, requeue=False)

                yield Event(
                    id=message.header.properties.message_id or f"delivery:{tag}",
                    data=None,
                    ack=reject,
                    refused=f"amqp message of {size} bytes, over {size_text(cap)} "
                    "(FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES)",
                )
                continue
            message_id = message.header.properties.message_id or (
                "sha256:"
                + hashlib.sha256(orjson.dumps([delivery.exchange, delivery.routing_key]) + body).hexdigest()
            )

            async def ack(tag: int = tag) -> None:
                await channel.basic_ack(tag)

            yield Event(id=message_id, data=decode_body(body), ack=ack)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 5)


COMPONENT = Component(
    id="amqp",
    description="RabbitMQ (AMQP 0-9-1): publish persistent messages with publisher confirms. "
    "Credentials: {url} (amqp://user:pw@host:5672/vhost or amqps://...), optional {password}, {ca} (PEM).",
    functions={"publish": publish, "consume": passthrough},
    default_function="publish",
    fields=AmqpPublishFields,
    events={"consume": consume_events},
    function_descriptions={
        "consume": "Trigger: one execution per message of `queue` (input: the JSON body, else its text); "
        "acknowledged once the execution is stored; the message-id is the idempotency key.",
        "publish": "Publish the body to an exchange; succeeds once the broker confirmed it; passes the "
        "message on with metadata.amqp.",
    },
)
