"""Readiness while draining: from the first SIGTERM/SIGINT (``flowyard.server`` sets
``app.state.draining``) `/health/ready` answers 503 with Retry-After; liveness stays 200.
The real signal path is tested with processes in tests/engine/test_shutdown.py."""

from __future__ import annotations

import httpx
from fastapi import FastAPI


async def test_ready_answers_503_with_retry_after_while_draining(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    r = await client.get("/health/ready")
    assert r.status_code == 200 and "retry-after" not in r.headers
    app.state.draining = True
    r = await client.get("/health/ready")
    assert r.status_code == 503
    assert int(r.headers["Retry-After"]) > 0
    assert r.json() == {"status": "draining", "database": "unchecked"}
    assert (await client.get("/health")).status_code == 200
