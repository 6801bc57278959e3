"""Pure ASGI middleware: request ids, HTTP metrics and the request body limit.

Pure ASGI rather than ``BaseHTTPMiddleware`` because it sits on every request,
including the webhook hot path.

The request id is the caller's ``X-Request-ID`` when it is sane (1 to 128 of
``A-Z a-z 0-9 . _ : -``), else a generated one; it is echoed in the response and set
in ``logconfig.request_id`` for every log line of the request. Metrics are labelled
with the route template (``/flows/{flowId}``), never the raw path.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowyard import metrics
from flowyard.errors import PayloadTooLarge, Problem, error_body
from flowyard.logconfig import request_id as request_id_var

_HEADER = b"x-request-id"
_SANE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# Set by an adapter that answers without FastAPI's routing (the webhook fast path).
ROUTE_KEY = "flowyard.route"


def route_of(scope: Scope) -> str:
    """The route template of an answered request: bounded, whatever the path was."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    fixed = scope.get(ROUTE_KEY)
    return fixed if isinstance(fixed, str) else metrics.UNMATCHED


def request_id_of(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", "-"))


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid: bytes | None = None
        length: int | None = None
        for name, value in scope["headers"]:
            if name == _HEADER:
                rid = value if _SANE_ID.fullmatch(value) else None
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
        if not rid:
            rid = os.urandom(8).hex().encode()
        text = rid.decode("latin-1")
        scope.setdefault("state", {})["request_id"] = text
        request_id_var.set(text)
        header = (_HEADER, rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self._call(scope, receive, send_with_id, length)
        finally:
            metrics.http_request(scope["method"], route_of(scope), status, time.perf_counter() - started)

    async def _call(self, scope: Scope, receive: Receive, send_with_id: Send, length: int | None) -> None:
        limit = self.max_body_bytes
        if length is not None and length > limit:
            await _reject_too_large(send_with_id, limit)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"Request body exceeds {limit} bytes.")
            return message

        await self.app(scope, limited_receive, send_with_id)


async def _reject_too_large(send: Any, limit: int) -> None:
    body = orjson.dumps(error_body(413, [Problem(f"Request body exceeds {limit} bytes.")]))
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
