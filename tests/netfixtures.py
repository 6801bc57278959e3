"""Helpers for tests that need the engine with their own settings, or a loopback upstream."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from flowyard.app import create_app
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database

MakeClient = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def configured(
    engine_settings: Settings, db: Database, registry: Registry
) -> AsyncIterator[MakeClient]:
    """``await configured(**settings)``: a client of an app running the engine with these settings.
    Several apps on one database stand for several API processes."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(
            *, run_engine: bool = True, database: Database | None = None, **overrides: Any
        ) -> httpx.AsyncClient:
            settings = engine_settings.model_copy(update=overrides)
            app = create_app(settings, db=database or db, registry=registry, run_engine=run_engine)
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://flowyard.test"
            )
            await stack.enter_async_context(client)
            return client

        yield make


@dataclass
class Upstream:
    """A loopback HTTP server answering GET with ``body`` (chunked when ``chunked``)."""

    port: int = 0
    hits: list[str] = field(default_factory=list)
    body: bytes = b'{"ok": true}'
    chunked: bool = False


def redirect_path(target: str) -> str:
    """A path on the upstream that answers 302 to ``target``."""
    return "/redirect/" + quote(target, safe="")


@contextlib.contextmanager
def upstream_server(host: str = "127.0.0.1") -> Iterator[Upstream]:
    state = Upstream()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.hits.append(self.path)
            if self.path.startswith("/redirect/"):
                self.send_response(302)
                self.send_header("Location", unquote(self.path[len("/redirect/") :]))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if state.chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                step = 64 * 1024
                for i in range(0, len(state.body), step):
                    part = state.body[i : i + step]
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(state.body)))
                self.end_headers()
                self.wfile.write(state.body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
