"""The ``redis`` component: get/set with TTL, publish, xadd (redis-py's asyncio client).

The connection pool of a credential connects to the address the network policy
vetted; with ``rediss://`` TLS still verifies the certificate against the
credential's host name. One pool per credential and runner process, closed when
unused.

redis-py is imported by the functions that talk to a server, on first use: a process that
only lists or validates components (the API) or runs flows without redis steps never loads
it (``tests/unit/test_lazy_imports.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import orjson
from pydantic import Field, field_validator

from flowyard import jsonvalue
from flowyard.components.builtins import ComponentError, _Fields, _render_url, passthrough
from flowyard.components.connectors.common import (
    Pools,
    as_text,
    check_mapper,
    credential_key,
    credential_url,
    render,
    size_text,
    vet_host,
)
from flowyard.components.context import StepContext
from flowyard.components.events import Event, TriggerContext
from flowyard.components.registry import Component, Message

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.connection import SSLConnection

_SCHEMES = {"redis": 6379, "rediss": 6380}


class RedisFields(_Fields):
    key: str = Field(
        min_length=1,
        max_length=1024,
        description="The key (get, set), channel (publish) or stream (xadd); may hold {{ JSONata }}.",
    )
    value: Any = Field(
        None,
        description="Mapper (JSONata leaves) for what set stores, publish sends or xadd appends "
        "(xadd: an object of fields); default: the message data. Strings are stored as they are, "
        "anything else as JSON.",
    )
    ttl: float | None = Field(None, gt=0, le=10 * 365 * 86400, description="set: expiry in seconds.")
    parseJson: bool = Field(True, description="get: decode a JSON value (other values stay strings).")
    maxLen: int | None = Field(None, ge=1, description="xadd: trim the stream to about this many entries.")
    timeout: float = Field(10.0, gt=0, le=300, description="Connect and command timeout, seconds.")
    group: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="xread (trigger): the consumer group (created at the stream's end if missing); "
        "default flowyard-<flow id>.",
    )
    count: int = Field(10, ge=1, le=1000, description="xread: entries read per call.")

    _value = field_validator("value")(check_mapper)


@functools.cache
def _vetted_ssl_connection() -> type[SSLConnection]:
    """redis-py's TLS connection to the vetted address, verifying the certificate against the
    host name (a class made on first use, like the import of redis-py)."""
    from redis.asyncio.connection import SSLConnection

    class VettedSSLConnection(SSLConnection):
        def __init__(self, *, vetted_address: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.vetted_address = vetted_address

        def _connection_arguments(self) -> Mapping[str, Any]:
            return {
                **super()._connection_arguments(),
                "host": self.vetted_address,
                "server_hostname": self.host,
            }

    return VettedSSLConnection


async def _connect(credentials: dict[str, Any], ctx: StepContext, seconds: float) -> aioredis.Redis:
    import redis.asyncio as aioredis

    ep = credential_url(credentials, "redis", _SCHEMES)
    address = await vet_host(ctx.settings, ep.host, ep.port, within=seconds)
    db_text = ep.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ComponentError(f"redis: the credential url path must be a database number, not {db_text!r}")
    common: dict[str, Any] = {
        "port": ep.port,
        "username": ep.username,
        "password": ep.password,
        "db": int(db_text),
        "socket_timeout": seconds,
        "socket_connect_timeout": seconds,
        "max_connections": 10,
        "timeout": seconds,
        "client_name": "flowyard",
    }
    if ep.scheme == "rediss":
        pool = aioredis.BlockingConnectionPool(
            connection_class=_vetted_ssl_connection(),
            host=ep.host,
            vetted_address=address,
            ssl_ca_data=credentials.get("ca"),
            **common,
        )
    else:
        pool = aioredis.BlockingConnectionPool(host=address, **common)
    return aioredis.Redis(connection_pool=pool)


async def _close(client: aioredis.Redis) -> None:
    await client.aclose(close_connection_pool=True)


_POOLS: Pools[aioredis.Redis] = Pools(_close)


async def _call(message: Message, ctx: StepContext, function: str) -> Message:
    from redis import exceptions as redis_errors

    f: RedisFields = ctx.fields
    data = message["data"]
    key = _render_url(f.key, data) if "{{" in f.key else f.key
    if not key:
        raise ComponentError("redis: the key is empty")
    value = data if f.value is None else render(f.value, data)
    cap = ctx.settings.connector_max_result_bytes
    creds = ctx.credentials or {}
    pool_key = credential_key("redis", creds, ctx.settings)
    meta = message["metadata"]
    try:
        async with (
            asyncio.timeout(f.timeout),
            _POOLS.use(
                pool_key, lambda: _connect(creds, ctx, f.timeout), ctx.settings.connector_idle_seconds
            ) as client,
        ):
            if function == "get":
                length = await client.strlen(key)
                if length > cap:
                    raise ComponentError(
                        f"redis: the value of {key!r} is {length} bytes, over {size_text(cap)} "
                        "(FLOWYARD_CONNECTOR_MAX_RESULT_BYTES)"
                    )
                raw = await client.get(key)
                if raw is not None and len(raw) > cap:
                    raise ComponentError(f"redis: the value of {key!r} is over {size_text(cap)}")
                out: Any = None
                if raw is not None:
                    out = raw.decode("utf-8", errors="replace")
                    if f.parseJson:
                        try:
                            out = jsonvalue.loads(raw)
                        except (orjson.JSONDecodeError, jsonvalue.TooDeep):
                            pass
                return {"data": {"key": key, "value": out}, "metadata": meta}
            if function == "set":
                await client.set(key, as_text(value), px=int(f.ttl * 1000) if f.ttl else None)
                details: dict[str, Any] = {"key": key}
            elif function == "publish":
                receivers = await client.publish(key, as_text(value))
                details = {"channel": key, "receivers": receivers}
            else:
                if not isinstance(value, dict) or not value:
                    raise ComponentError("redis: xadd needs an object of fields (value or the data)")
                entry = {str(k): as_text(v) for k, v in value.items()}
                entry_id = await client.xadd(key, entry, maxlen=f.maxLen, approximate=True)  # type: ignore[arg-type]
                details = {
                    "stream": key,
                    "id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
                }
    except TimeoutError:
        await _POOLS.discard(pool_key)
        raise ComponentError(f"redis: timed out after {f.timeout:g} s") from None
    except redis_errors.ResponseError as exc:
        raise ComponentError(f"redis: {exc}") from None
    except (redis_errors.RedisError, OSError) as exc:
        await _POOLS.discard(pool_key)
        raise ComponentError(f"redis: {type(exc).__name__}: {exc}") from None
    return {"data": data, "metadata": {**meta, "redis": details}}


async def redis_get(message: Message, ctx: StepContext) -> Message:
    return await _call(message, ctx, "get")


async def redis_set(message: Message, ctx: StepContext) -> Message:
    return await _call(message, ctx, "set")


async def redis_publish(message: Message, ctx: StepContext) -> Message:
    return await _call(message, ctx, "publish")


async def redis_xadd(message: Message, ctx: StepContext) -> Message:
    return await _call(message, ctx, "xadd")


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def decode_entry(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """A stream entry as execution input: each field's value parsed as JSON when it parses (what
    ``xadd`` stores for non-strings) within the depth limit (``flowyard.jsonvalue``), else kept
    as text."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        try:
            out[_text(k)] = jsonvalue.loads(v)
        except (orjson.JSONDecodeError, jsonvalue.TooDeep):
            out[_text(k)] = _text(v)
    return out


# XREADGROUP inside the server, answering each entry as {id, fields, size} (size: bytes of its
# field names and values) while the reply stays within the cap (ARGV[4]); an entry over the cap
# comes back as {id, false, size} (never sent), and one that would take the reply past the cap
# as {id, 0, size} (read alone next, with XRANGE). Non-blocking (BLOCK is not allowed in
# scripts): the caller polls.
_BOUNDED_XREADGROUP = """
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                         'STREAMS', KEYS[1], ARGV[5])
local out = {}
if not reply or not reply[1] then return out end
local cap = tonumber(ARGV[4])
local total = 0
for i, entry in ipairs(reply[1][2]) do
  local fields = entry[2]
  local size = 0
  if fields then
    for _, v in ipairs(fields) do size = size + #v end
  end
  if size > cap then
    out[i] = {entry[1], false, size}
  elseif total + size > cap then
    out[i] = {entry[1], 0, size}
  else
    total = total + size
    out[i] = {entry[1], fields or {}, size}
  end
end
return out
"""
_POLL_FIRST = 0.05
_POLL_MAX = 0.5


async def xread_events(ctx: TriggerContext) -> AsyncIterator[Event]:
    """The ``xread`` trigger: XREADGROUP as consumer ``flowyard-<flow id>`` (the same name in
    whichever process holds the flow's lease), so entries a dead holder read but never
    acknowledged are its pending entries, re-read first (id 0) by the next holder; XACK
    after the execution is stored. Closing deletes the consumer when nothing is pending.

    The read runs in a server-side script that answers an entry over
    ``FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES`` with its id and size only (the entry is never sent
    here); the consumer refuses it alone and XACKs it. Scripts cannot block, so an idle stream
    is polled (every 50 ms after a message, backing off to 500 ms)."""
    from redis import exceptions as redis_errors

    f: RedisFields = ctx.fields
    stream = f.key
    group = f.group or f"flowyard-{ctx.flow_id}"
    consumer = f"flowyard-{ctx.flow_id}"
    cap = ctx.settings.max_trigger_payload_bytes
    client = await _connect(ctx.credentials or {}, cast(StepContext, ctx), f.timeout)
    read = client.register_script(_BOUNDED_XREADGROUP)
    try:
        try:
            await client.xgroup_create(stream, group, id="$", mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise ComponentError(f"redis: {exc}") from None
        await ctx.subscribed()
        backlog = "0"  # own pending entries first, then new ones
        idle = _POLL_FIRST
        while True:
            entries = await read(keys=[stream], args=[group, consumer, f.count, cap, backlog or ">"])
            if backlog:
                if not entries:
                    backlog = ""
                    continue
                backlog = _text(entries[-1][0])
            elif not entries:
                await asyncio.sleep(idle)
                idle = min(idle * 2, _POLL_MAX)
                continue
            idle = _POLL_FIRST
            for raw_id, fields, size in entries:
                entry_id = _text(raw_id)

                async def ack(entry_id: str = entry_id) -> None:
                    await client.xack(stream, group, entry_id)

                if fields is None:  # Lua false: over the cap, never sent here
                    yield Event(
                        id=f"{stream}:{entry_id}",
                        data=None,
                        ack=ack,
                        refused=f"redis stream entry of {size} bytes, over {size_text(cap)} "
                        "(FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES)",
                    )
                    continue
                if fields == 0:  # within the cap, but not in the same reply as the others
                    found = await client.xrange(stream, entry_id, entry_id)
                    fields = [x for pair in found[0][1].items() for x in pair] if found else []
                if not fields:  # deleted from the stream while pending: nothing to run
                    await ack()
                    continue
                pairs = dict(zip(fields[::2], fields[1::2], strict=True))
                yield Event(id=f"{stream}:{entry_id}", data=decode_entry(pairs), ack=ack)
    except (redis_errors.RedisError, OSError) as exc:
        raise ComponentError(f"redis: {type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                pending = await client.xpending_range(
                    stream, group, min="-", max="+", count=1, consumername=consumer
                )
                if not pending:
                    await client.xgroup_delconsumer(stream, group, consumer)
        with contextlib.suppress(Exception):
            await client.aclose(close_connection_pool=True)


COMPONENT = Component(
    id="redis",
    description="Redis: get, set (with TTL), publish, xadd. Credentials: {url} "
    "(redis://user:pw@host:6379/0 or rediss://...), optional {password}, {ca} (PEM).",
    functions={
        "get": redis_get,
        "set": redis_set,
        "publish": redis_publish,
        "xadd": redis_xadd,
        "xread": passthrough,
    },
    default_function="get",
    fields=RedisFields,
    events={"xread": xread_events},
    function_descriptions={
        "xread": "Trigger: one execution per entry of the stream `key`, read with a consumer group "
        "(input: the entry's fields, JSON values parsed); XACK once the execution is stored.",
        "get": "Emit {key, value} (value null when the key does not exist).",
        "set": "Store the value (optional ttl); passes the message on with metadata.redis.",
        "publish": "Publish to a channel; passes the message on with metadata.redis.receivers.",
        "xadd": "Append an entry to a stream; passes the message on with metadata.redis.id.",
    },
)
