"""The HTTP server of an API process (``flowyard serve``, ``flowyard _api``): uvicorn,
with flowyard's answer to SIGTERM and SIGINT.

uvicorn on a signal closes the socket at once and, once done, raises the signal
again (``Server.capture_signals``), so the process ends "killed by SIGTERM"
(status -15) and a load balancer never saw it go. Here the first signal:

1. marks the process draining: ``GET /health/ready`` answers 503 with
   ``Retry-After`` while requests are still served, each response closing its
   connection (``flowyard.http_protocol``);
2. stops the embedded engine, if any (no more claims; running executions finish
   within ``FLOWYARD_STOP_GRACE_SECONDS``; the rest goes back to the queue);
3. after at least ``FLOWYARD_DRAIN_SECONDS``, lets uvicorn stop accepting,
   finish open requests and run the lifespan shutdown; the process exits 0.

A second signal exits at once: uvicorn's force exit, and the engine hands back
what still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from flowyard import heap
from flowyard.http_protocol import mark_draining

log = logging.getLogger("flowyard.server")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_FORCED_HAND_BACK_SECONDS = 5.0


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, *, drain_seconds: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_seconds = drain_seconds
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        heap.settle()  # the app and its engine have started: what they hold lives on

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn's own, minus raising the signal again at the end: a drained stop is exit 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        loop = self._loop
        if self.signals > 1 or loop is None or not self.started:
            # A second signal (or one before the server runs): stop now, handing back what runs.
            self.force_exit = True
            self.should_exit = True
            if loop is not None:
                loop.call_soon_threadsafe(self._force_engine)
            return
        self.app.state.draining = True
        mark_draining(self.config)
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self._drain_then_exit(), name="flowyard-drain")

    async def _drain_then_exit(self) -> None:
        log.info("draining: /health/ready answers 503; stopping in %g s at the earliest", self.drain_seconds)
        engine = getattr(self.app.state, "engine", None)
        try:
            await asyncio.gather(
                asyncio.sleep(self.drain_seconds), engine.stop() if engine else asyncio.sleep(0)
            )
        finally:
            self.should_exit = True

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets=sockets)
        if self._drain is not None and not self._drain.done():
            # Forced: uvicorn skips the lifespan shutdown; let the engine hand back what it
            # held (moments, as it no longer waits for executions) before the loop ends.
            with contextlib.suppress(Exception, TimeoutError):
                async with asyncio.timeout(_FORCED_HAND_BACK_SECONDS):
                    await asyncio.shield(self._drain)

    def _force_engine(self) -> None:
        engine = getattr(self.app.state, "engine", None)
        if engine is not None:
            engine.worker.stop(force=True)
