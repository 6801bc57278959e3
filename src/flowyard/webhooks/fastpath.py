"""The one server of ``POST /webhooks/{flowId}``: an ASGI middleware in front of
the app, without routing, dependency injection and validation layers that cost
more CPU than the webhook itself. It only frames the exchange: ``handler.parse``
reads and validates the request, ``handler.handle`` answers it. Everything else
passes through to the app untouched (so does a path with more segments, which
the app answers 404)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from flowyard import metrics
from flowyard.api.middleware import ROUTE_KEY
from flowyard.errors import FlowyardError, Problem, error_body
from flowyard.ids import is_valid_id
from flowyard.logconfig import flow_id as flow_id_var
from flowyard.webhooks import handler

log = logging.getLogger(__name__)
PREFIX = "/webhooks/"
ROUTE = "/webhooks/{flowId}"
# What this middleware serves, for the route inventory (tests/api/test_permission_matrix.py).
ROUTES = frozenset({("POST", ROUTE)})


def serves(scope: Scope) -> bool:
    """Whether this is a request the fast path answers: ``POST /webhooks/{flowId}``, one
    non-empty segment after the prefix (anything else is the app's, which answers 404)."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    path: str = scope.get("path", "")
    if not path.startswith(PREFIX):
        return False
    flow_id = unquote(path[len(PREFIX) :])
    return bool(flow_id) and "/" not in flow_id


class _Disconnected(Exception):
    """The request ended before its body did."""


class WebhookFastPath:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not serves(scope):
            await self.app(scope, receive, send)
            return
        flow_id = unquote(scope["path"][len(PREFIX) :])
        scope[ROUTE_KEY] = ROUTE
        if is_valid_id(flow_id):  # the caller's text goes into no log line unchecked
            flow_id_var.set(flow_id)
        try:
            reply = await self._handle(scope, receive, flow_id)
            status, body, headers = reply.status, orjson.dumps(reply.body), reply.headers
            metrics.webhook(None)
        except _Disconnected:
            return  # nobody to answer; a truncated body is never accepted
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
        raw_headers = [(b"content-length", str(len(body)).encode())]
        if headers:
            extra = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
            if not any(k == b"content-type" for k, _ in extra):
                raw_headers.append((b"content-type", b"application/json"))
            raw_headers += extra
        else:
            raw_headers.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: Scope, receive: Receive, flow_id: str) -> handler.Reply:
        message = await receive()  # the body limit is enforced by RequestContextMiddleware's receive
        raw: bytes = message.get("body", b"")
        if message.get("more_body"):
            chunks = [raw]
            while message.get("more_body"):
                message = await receive()
                chunks.append(message.get("body", b""))
            raw = b"".join(chunks)
        if message["type"] == "http.disconnect":
            # The client went, or the server gave up on a stalled body (flowyard.http_protocol).
            raise _Disconnected
        call = handler.parse(flow_id, scope["headers"], scope.get("query_string", b""), raw)
        state = self.state
        return await handler.handle(
            call,
            db=state.db,
            batcher=state.webhooks,
            hub=state.hub,
            poll=state.settings.wait_poll_interval,
        )
