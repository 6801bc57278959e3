"""ASGI fast path for ``POST /webhooks/{flowId}``: the same ``handler.handle``
as the FastAPI route, without routing, dependency injection and validation
layers that cost more CPU than the webhook itself. Everything else passes
through to the app untouched."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from flowyard import metrics
from flowyard.api.middleware import ROUTE_KEY
from flowyard.errors import FlowyardError, Problem, error_body
from flowyard.ids import is_valid_id
from flowyard.logconfig import flow_id as flow_id_var
from flowyard.webhooks import handler

log = logging.getLogger(__name__)
_PREFIX = "/webhooks/"
ROUTE = "/webhooks/{flowId}"


class WebhookFastPath:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith(_PREFIX):
            await self.app(scope, receive, send)
            return
        flow_id = unquote(path[len(_PREFIX) :])
        if not flow_id or "/" in flow_id:
            await self.app(scope, receive, send)
            return
        scope[ROUTE_KEY] = ROUTE
        if is_valid_id(flow_id):  # the caller's text goes into no log line unchecked
            flow_id_var.set(flow_id)
        try:
            reply = await self._handle(scope, receive, flow_id)
            status, body, headers = reply.status, orjson.dumps(reply.body), reply.headers
            metrics.webhook(None)
        except FlowyardError as exc:
            status = exc.status
            body = orjson.dumps(error_body(exc.status, exc.problems))
            headers = exc.headers
            metrics.webhook(status)
        except Exception:
            log.exception("webhook for flow %s failed unexpectedly", flow_id[:64])
            metrics.webhook(500)
            status, headers = 500, {}
            rid = scope.get("state", {}).get("request_id", "-")
            body = orjson.dumps(error_body(500, [Problem(f"Internal error (request id {rid}).")]))
        extra = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
        raw_headers = [(b"content-length", str(len(body)).encode())]
        if not any(k == b"content-type" for k, _ in extra):
            raw_headers.append((b"content-type", b"application/json"))
        raw_headers += extra
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: Scope, receive: Receive, flow_id: str) -> handler.Reply:
        content_type = idempotency_key = signature = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"idempotency-key":
                idempotency_key = value.decode("latin-1")
            elif name == b"x-flowyard-signature":
                signature = value.decode("latin-1")
        wait = None
        if scope.get("query_string"):
            values = parse_qs(scope["query_string"].decode("latin-1")).get("wait")
            if values:
                wait = handler.parse_wait(values[-1])
        chunks = []
        while True:  # the body limit is enforced by RequestContextMiddleware's receive
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        state = self.state
        return await handler.handle(
            db=state.db,
            batcher=state.webhooks,
            hub=state.hub,
            poll=state.settings.wait_poll_interval,
            flow_id=flow_id,
            content_type=content_type,
            raw=b"".join(chunks),
            wait=wait,
            idempotency_key=idempotency_key,
            signature=signature,
        )
