"""The HTTP/1.1 connection of an API process: uvicorn's httptools protocol with the limits
a reverse proxy would enforce (docs/configuration.md, ``FLOWYARD_HTTP_*``).

uvicorn's httptools protocol bounds none of these (its ``timeout_keep_alive`` only runs
between a response and the next request; h11's ``h11_max_incomplete_event_size`` has no
httptools counterpart), and an ASGI layer sees a request only once its head is complete,
so it can neither bound the memory a head takes while it arrives nor time out a client
that never finishes it. Here, per connection:

- **head size and count**: a head (request line and header lines) larger than
  ``http_max_header_bytes`` or with more than ``http_max_headers`` fields is answered 431
  and the connection closed; a head still incomplete past the size is refused as it
  arrives, so it never takes more memory than the size and one read;
- **head timeout**: the head must arrive within ``http_header_timeout`` of the
  connection (of the first byte of a later request on a kept-alive one): else 408, or a
  silent close when nothing came at all (an idle connection);
- **body timeout**: a body that stalls for ``http_body_timeout`` between two reads is
  answered 408 (when no response started) and the connection closed; the application's
  ``receive()`` then returns ``http.disconnect`` and its answer goes nowhere;
- **keep-alive timeout**: uvicorn's ``timeout_keep_alive`` (``http_keepalive_timeout``).

Answers given here use the contract's error shape. The cost on the hot path is a few
comparisons per request (the header sizes are summed only when the reads that carried the
head exceed the limit), no task, and a timer only while a head or a body is still
incomplete after a read: about 2 µs per request over uvicorn's own protocol, measured on a
kept-alive connection (a webhook costs ~1.6 ms of CPU, docs/performance.md).

Shutdown: uvicorn closes every connection without a request in progress at once, which
resets a connection accepted a moment before whose request is still on the wire. Here a
connection with no request yet, or with its head under way, is given a moment to send it
(``SHUTDOWN_FIRST_REQUEST_SECONDS``, the head timeout at most) and that request is served
with ``Connection: close``; while the process drains, every response closes its
connection, so no client is left holding a kept-alive one when the process goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from flowyard.config import Settings
from flowyard.errors import Problem, error_body

log = logging.getLogger("flowyard.http")

SHUTDOWN_FIRST_REQUEST_SECONDS = 2.0
LINGER_SECONDS = 2.0


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(
            max_header_bytes=settings.http_max_header_bytes,
            max_headers=settings.http_max_headers,
            header_timeout=settings.http_header_timeout,
            body_timeout=settings.http_body_timeout,
            keepalive_timeout=settings.http_keepalive_timeout,
        )


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request already answered."""


def error_response(status: int, message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole response in the contract's error shape that closes its connection."""
    body = orjson.dumps(error_body(status, [Problem(message)]))
    lines = [STATUS_LINE[status]]
    for name, value in default_headers:
        lines += [name, b": ", value, b"\r\n"]
    lines += [
        b"content-type: application/json\r\n",
        b"content-length: ",
        str(len(body)).encode(),
        b"\r\nconnection: close\r\n\r\n",
        body,
    ]
    return b"".join(lines)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: HttpLimits
    # Set on this process's class by flowyard.server when the drain begins (a class attribute:
    # read once per request, it must cost next to nothing).
    draining = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False  # a request head has begun and is not complete
        self._head_bytes = 0  # bytes received in earlier reads since the head began
        self._chunk = 0  # bytes of the read being parsed
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._closing = False  # the server shuts down: serve what is under way, then close

    # -- connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, but a request refused here is not parsed further nor answered twice.
        if self._refused:
            return
        self._unset_keepalive_if_required()
        self._chunk = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._refused:
                log.debug("invalid HTTP request received")
                self._refuse(400, "Invalid HTTP request.")
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(431, f"Request header fields exceed {self.limits.max_header_bytes} bytes.")
            elif self._timer is None:
                self._arm(self.limits.header_timeout, self._head_timed_out)
            return
        cycle = self.cycle
        if cycle is not None and cycle.more_body:
            # Between two reads. (Also after an early response while the body still comes:
            # uvicorn's keep-alive timer is off then.)
            self._arm(self.limits.body_timeout, self._body_timed_out)
        elif self._timer is not None:
            self._disarm()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "Invalid HTTP request.")

    def shutdown(self) -> None:
        self._closing = True
        if self._refused:
            return  # answered; its lingering close ends it
        if self._in_head or self.cycle is None:
            # A request on its way (or a connection accepted a moment ago): let it arrive.
            self._arm(min(self.limits.header_timeout, SHUTDOWN_FIRST_REQUEST_SECONDS), self._head_timed_out)
            return
        super().shutdown()

    # -- parser callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        headers = self.headers
        limits = self.limits
        if len(headers) > limits.max_headers:
            self._refuse(431, f"Requests may carry at most {limits.max_headers} header fields.")
            raise _Refused
        # The head came in the bytes received since it began: when they are few, it is small.
        if self._head_bytes + self._chunk > limits.max_header_bytes:
            size = len(self.url) + 4 * len(headers) + sum(len(n) + len(v) for n, v in headers)
            if size > limits.max_header_bytes:
                self._refuse(431, f"Request header fields exceed {limits.max_header_bytes} bytes.")
                raise _Refused
        super().on_headers_complete()
        if (self._closing or self.draining) and self.cycle is not None:
            self.cycle.keep_alive = False

    # -- timeouts ------------------------------------------------------------------------------

    def _arm(self, seconds: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._in_head:
            self._refuse(408, "The request head did not arrive in time.")
        elif self.cycle is None or self.cycle.response_complete:
            self.transport.close()  # nothing came: an idle connection

    def _body_timed_out(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if cycle.response_complete:  # answered early, and the rest of the body stalls
            self.transport.close()
            return
        if not cycle.more_body:
            return
        if self.flow.read_paused:  # it is the application that does not read: not the client's stall
            self._arm(self.limits.body_timeout, self._body_timed_out)
            return
        if cycle.response_started:
            self.transport.close()
        else:
            self._refuse(408, "The request body did not arrive in time.")
        cycle.disconnected = True
        cycle.message_event.set()

    def _refuse(self, status: int, message: str) -> None:
        self._refused = True
        self._in_head = False
        self._disarm()
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(error_response(status, message, self.server_state.default_headers))
        if transport.can_write_eof():
            # A lingering close: closing with the rest of the request unread would reset the
            # connection, and the client could lose the answer. Drop what still comes until
            # the client closes (eof_received) or a moment passed.
            transport.write_eof()
            self.flow.resume_reading()
            self._timer = self.loop.call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()


def protocol_class(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to this process's limits."""
    return type("FlowyardHttpProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


def mark_draining(config: Config) -> None:
    """From now on every response of this server closes its connection."""
    protocol = getattr(config, "http_protocol_class", None)
    if isinstance(protocol, type) and issubclass(protocol, LimitedHttpToolsProtocol):
        protocol.draining = True
