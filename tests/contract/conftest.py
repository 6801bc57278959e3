"""The server the contract tests talk to: a real ``flowyard serve`` on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.serve import Server
from tests.engine.test_processes import _empty


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'flowyard.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
        asyncio.run(_empty(url))  # the server then creates the administrator
    served = Server(url, tmp_path)
    try:
        served.wait_ready()
        yield served
    finally:
        served.stop()
