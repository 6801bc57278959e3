"""Request rules that hold on every path, before routing (pure ASGI, like ``middleware``):

- NUL (U+0000, raw or as ``%00``) in the path or the query string: ``400`` in the error
  shape. PostgreSQL cannot store it, and no id, name or filter holds it.
- One trailing slash is ignored: ``/flows/`` is ``/flows`` (no ``307`` redirect, which
  clients that do not follow redirects take for an empty answer). A path that is a route
  as written (``/users/``, ``/console/``) is left alone.
- A ``405`` names every method of the path in ``Allow``, not only those of the first route
  that matched it.

The route table is read once, at the first request that needs it (routes are all added by
then); requests that need none of the rules cost a few string tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from fastapi import routing
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowyard.errors import Problem, error_body

_Table = list[tuple[re.Pattern[str], frozenset[str]]]
_VARIABLE = re.compile(r"\{[^}]*\}")


class RequestRules:
    def __init__(self, app: ASGIApp, *, routes: Callable[[], Sequence[Any]]) -> None:
        self.app = app
        self._routes = routes
        self._table: _Table | None = None
        self._literal: dict[str, frozenset[str]] = {}

    def table(self) -> _Table:
        if self._table is None:
            table: _Table = []
            variable: list[re.Pattern[str]] = []
            literal: dict[str, set[str]] = {}
            for context in routing.iter_route_contexts(self._routes()):
                regex = getattr(context, "path_regex", None)
                if regex is None:
                    regex = getattr(context.route, "path_regex", None)
                if isinstance(regex, re.Pattern):
                    methods = frozenset(context.methods or ())
                    table.append((regex, methods))
                    path = getattr(context, "path", None)
                    if isinstance(path, str) and methods and not _VARIABLE.search(path):
                        literal.setdefault(path, set()).update(methods)
                    else:
                        variable.append(regex)
            # A literal path that a path with a variable also matches (/tokens/introspect and
            # /tokens/{id}) is its own resource: it answers its own methods, and 405 otherwise.
            self._literal = {
                path: frozenset(methods)
                for path, methods in literal.items()
                if any(regex.match(path) for regex in variable)
            }
            self._table = table
        return self._table

    def _matches(self, path: str) -> bool:
        return any(regex.match(path) for regex, _ in self.table())

    def allowed(self, path: str) -> list[str]:
        """Every method some route of ``path`` answers, sorted."""
        self.table()
        if path in self._literal:
            return sorted(self._literal[path])
        methods: set[str] = set()
        for regex, route_methods in self.table():
            if regex.match(path):
                methods |= route_methods
        return sorted(methods)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        query: bytes = scope.get("query_string", b"")
        if "\x00" in path or b"\x00" in query or b"%00" in query:
            where = "path" if "\x00" in path else "query string"
            await answer(send, 400, f"The {where} must not contain NUL characters (U+0000).")
            return
        if len(path) > 1 and path.endswith("/") and not self._matches(path) and self._matches(path[:-1]):
            scope = dict(scope)
            scope["path"] = path = path[:-1]
            raw = scope.get("raw_path")
            if isinstance(raw, bytes) and raw.endswith(b"/"):
                scope["raw_path"] = raw[:-1]

        if self._table is None:
            self.table()
        shadowed = self._literal.get(path)
        if shadowed is not None and scope["method"] not in shadowed:
            await answer(send, 405, "Method not allowed.", [(b"allow", ", ".join(sorted(shadowed)).encode())])
            return

        async def send_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                allow = ", ".join(self.allowed(path)).encode()
                message = {**message, "headers": [*headers, (b"allow", allow)]}
            await send(message)

        await self.app(scope, receive, send_allow)


async def answer(
    send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An error answered in the contract's shape, from ASGI code below the framework."""
    body = orjson.dumps(error_body(status, [Problem(message)]))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
