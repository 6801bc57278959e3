"""Pure ASGI middleware: request ids and the request body limit.

Pure ASGI rather than ``BaseHTTPMiddleware`` because it sits on every request,
including the webhook hot path.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowyard.errors import PayloadTooLarge, Problem, error_body

_HEADER = b"x-request-id"


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
                rid = value[:128]
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
        if not rid:
            rid = os.urandom(8).hex().encode()
        scope.setdefault("state", {})["request_id"] = rid.decode("latin-1")
        header = (_HEADER, rid)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

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
