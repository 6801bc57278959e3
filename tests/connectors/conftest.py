"""Shared by the connector tests: one step of a connector component run through the engine's
runner (tests.engine.test_graph.run) with a stored-credential stand-in, and the real servers
on this machine (skipped with the reason outside CI when one is absent, failing in CI)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowyard.components.netpolicy import build_client
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.queue.records import Outcome
from tests.conftest import IN_CI
from tests.engine.test_graph import run

REGISTRY = Registry.load()
LOOPBACK = ["127.0.0.0/8", "::1/128"]


def require_server(name: str, port: int, host: str = "127.0.0.1") -> None:
    try:
        with socket.create_connection((host, port), timeout=2):
            pass
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"{name} at {host}:{port} is required in CI: {exc}")
        pytest.skip(f"{name} at {host}:{port} is not reachable ({exc})")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Loopback opened explicitly: the servers under test listen there."""
    return Settings(http_allow_networks=LOOPBACK, step_timeout=30, sql_sqlite_dir=tmp_path)


@pytest.fixture
def closed_settings(tmp_path: Path) -> Settings:
    """The default outbound policy: loopback and private networks refused."""
    return Settings(step_timeout=30, sql_sqlite_dir=tmp_path)


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with build_client(settings) as client:
        yield client


def step_error(outcome: Outcome) -> str:
    """The failed step's own message (without the engine's "step <node> failed: ")."""
    assert outcome.status == "failed", outcome
    return str(outcome.error).removeprefix("step c failed: ")


async def step(
    http: httpx.AsyncClient,
    settings: Settings,
    component: str,
    function: str,
    fields: dict[str, Any],
    credentials: dict[str, Any] | None,
    data: Any = None,
) -> Outcome:
    """Run webhook -> <component.function> once; the credential is the node's credentials_id."""
    node: dict[str, Any] = {"id": "c", "componentId": component, "function": function, "fields": fields}
    if credentials is not None:
        node["credentials_id"] = "cred"
    return await run(
        http,
        [{"id": "in", "componentId": "webhook"}, node],
        [{"source": "in", "target": "c"}],
        {} if data is None else data,
        settings,
        registry=REGISTRY,
        credentials={"cred": credentials} if credentials is not None else None,
    )


def outputs(outcome: Outcome, node: str = "c") -> list[Any]:
    assert outcome.status == "succeeded", outcome.error
    return next(s for s in outcome.steps if s.node_id == node).output


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (for timeouts)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
