"""What every connector shares: credentials parsing, the outbound network policy for
non-HTTP protocols, per-credential connection pools that close when idle, and
JSON-safe, bounded results."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import hashlib
import ssl
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit

import httpcore
import orjson

from flowyard.components.builtins import ComponentError
from flowyard.components.expressions import ExpressionError, apply_mapper, compile_expression, compile_mapper
from flowyard.components.netpolicy import DestinationRefused, NetworkPolicy, Resolver, VettingBackend
from flowyard.components.retry import NonRetryable

if TYPE_CHECKING:
    from flowyard.config import Settings

T = TypeVar("T")


async def vet_host(
    settings: Settings, host: str, port: int, *, within: float, resolver: Resolver | None = None
) -> str:
    """The one address a connector connects to for ``host``: resolved once, vetted by the
    outbound network policy (``FLOWYARD_OUTBOUND_ALLOW_NETWORKS`` opens networks). The
    caller connects to this address, never to the name (no second lookup). Raises
    ComponentError with the refusal."""
    backend = VettingBackend(NetworkPolicy(settings.http_allow_networks), resolver=resolver)
    try:
        addresses = await backend.vetted_addresses(host, port, within)
    except DestinationRefused as exc:  # the network policy: no retry makes it allowed
        raise NonRetryable(str(exc)) from None
    except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
        raise ComponentError(str(exc)) from None
    return addresses[0]


@dataclass(frozen=True)
class Endpoint:
    """A credential's ``url`` taken apart (the password may also come as ``password``)."""

    scheme: str
    host: str
    port: int
    username: str | None
    password: str | None
    path: str
    query: str


def credential_url(credentials: dict[str, Any] | None, component: str, schemes: dict[str, int]) -> Endpoint:
    """Parse ``credentials["url"]``; ``schemes`` maps each accepted scheme to its default port."""
    if not credentials or not isinstance(credentials.get("url"), str):
        raise NonRetryable(f"{component}: the node needs credentials_id naming a secret with a 'url'")
    try:
        parts: SplitResult = urlsplit(credentials["url"])
        port = parts.port
    except ValueError as exc:
        raise ComponentError(f"{component}: the credential url is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise ComponentError(
            f"{component}: the credential url scheme {scheme!r} is not one of {', '.join(sorted(schemes))}"
        )
    if not parts.hostname:
        raise ComponentError(f"{component}: the credential url names no host")
    password = credentials.get("password")
    if password is None and parts.password is not None:
        password = unquote(parts.password)
    username = credentials.get("username")
    if username is None and parts.username is not None:
        username = unquote(parts.username)
    return Endpoint(
        scheme=scheme,
        host=parts.hostname,
        port=port or schemes[scheme],
        username=str(username) if username is not None else None,
        password=str(password) if password is not None else None,
        path=parts.path,
        query=parts.query,
    )


def tls_context(credentials: dict[str, Any] | None) -> ssl.SSLContext:
    """Verifying TLS context; a credential's ``ca`` (PEM) is trusted in addition to the system's."""
    context = ssl.create_default_context()
    ca = (credentials or {}).get("ca")
    if ca:
        try:
            context.load_verify_locations(cadata=str(ca))
        except ssl.SSLError as exc:
            raise ComponentError(f"the credential's 'ca' is not a PEM certificate: {exc}") from None
    return context


def credential_key(component: str, credentials: dict[str, Any], settings: Settings) -> str:
    """Pools are shared by equal credentials (same server, same account) under the same outbound
    policy, never across them."""
    policy = [settings.http_allow_networks, str(settings.sql_sqlite_dir)]
    return hashlib.sha256(
        orjson.dumps([component, credentials, policy], option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


class _Entry(Generic[T]):
    __slots__ = ("idle", "last_used", "ready", "users", "value")

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self.value: T | None = None
        self.ready = asyncio.Event()
        self.users = 0
        self.last_used = time.monotonic()


class Pools(Generic[T]):
    """Connections (or pools of them) shared per credential in one process, on one event loop,
    closed once unused for ``FLOWYARD_CONNECTOR_IDLE_SECONDS``."""

    def __init__(self, close: Callable[[T], Awaitable[None]]) -> None:
        self._close = close
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Entry[T]]] = (
            weakref.WeakKeyDictionary()
        )
        self._reapers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    def _entries(self) -> dict[str, _Entry[T]]:
        return self._by_loop.setdefault(asyncio.get_running_loop(), {})

    def __len__(self) -> int:
        return len(self._by_loop.get(asyncio.get_running_loop(), {}))

    @asynccontextmanager
    async def use(self, key: str, create: Callable[[], Awaitable[T]], idle: float) -> AsyncIterator[T]:
        entries = self._entries()
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = _Entry(idle)
            try:
                entry.value = await create()
            except BaseException:
                del entries[key]
                entry.ready.set()
                raise
            entry.ready.set()
            self._reap_later()
        else:
            await entry.ready.wait()
            if entries.get(key) is not entry:  # its creation failed: try once more, ourselves
                async with self.use(key, create, idle) as value:
                    yield value
                return
        assert entry.value is not None
        entry.users += 1
        try:
            yield entry.value
        finally:
            entry.users -= 1
            entry.last_used = time.monotonic()

    async def discard(self, key: str, value: T | None = None) -> None:
        """Close and forget a pool that failed (the next use makes a new one); with ``value``,
        only if that is still the pool under ``key``."""
        entries = self._entries()
        entry = entries.get(key)
        if entry is None or (value is not None and entry.value is not value):
            return
        del entries[key]
        if entry.value is not None:
            await self._quiet_close(entry.value)

    async def close_all(self) -> None:
        entries = self._entries()
        while entries:
            _, entry = entries.popitem()
            if entry.value is not None:
                await self._quiet_close(entry.value)

    async def _quiet_close(self, value: T) -> None:
        try:
            await asyncio.wait_for(self._close(value), 10)
        except Exception:  # closing a broken connection may fail; it is gone either way
            pass

    def _reap_later(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._reapers.get(loop)
        if task is None or task.done():
            self._reapers[loop] = loop.create_task(self._reap())

    async def _reap(self) -> None:
        """Runs while this loop has pools: wakes at most once a second, closes the idle ones."""
        entries = self._entries()
        while entries:
            await asyncio.sleep(min(1.0, min(e.idle for e in entries.values()) / 4))
            now = time.monotonic()
            for key, entry in list(entries.items()):
                if entry.users == 0 and entry.ready.is_set() and now - entry.last_used >= entry.idle:
                    if entries.get(key) is entry:
                        del entries[key]
                    if entry.value is not None:
                        await self._quiet_close(entry.value)


def jsonable(value: Any) -> Any:
    """A database or broker value as JSON: exact decimals as strings, times in ISO 8601,
    bytes as base64."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() and abs(value) < 2**53 else str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    return str(value)


def json_size(value: Any) -> int:
    return len(orjson.dumps(value))


def size_text(n: int) -> str:
    return f"{n / 1048576:g} MiB" if n % 1048576 == 0 else f"{n} bytes"


def check_expression(value: str | None) -> str | None:
    """Field validator: a JSONata expression must compile (the error names the field)."""
    if value is not None:
        try:
            compile_expression(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
    return value


def check_mapper(value: Any) -> Any:
    """Field validator: a mapper (object of JSONata leaves) must compile."""
    if isinstance(value, dict | str | list):
        try:
            compile_mapper(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
    return value


def render(value: Any, data: Any) -> Any:
    """Apply a mapper (JSONata string or object of them) to the message data."""
    if isinstance(value, dict | str | list):
        return apply_mapper(compile_mapper(value), data)
    return value


def as_text(value: Any) -> str:
    """A payload for a broker: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else orjson.dumps(value)
