"""Login throttling per username and per client address, kept in the database so
that every API process counts the same attempts. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from flowyard.app import create_app
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.iam.models import LoginThrottle
from tests.conftest import Factory

PER_USER = 3
PER_ADDRESS = 5
WINDOW = 600


@pytest.fixture
def settings(tmp_path: Path, db_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path,
        database_url=db_url,
        login_max_failures=PER_USER,
        login_max_failures_per_address=PER_ADDRESS,
        login_window_seconds=WINDOW,
    )


def client_from(app: FastAPI, address: str) -> httpx.AsyncClient:
    """A client whose requests come from ``address`` (an in-process ASGI call; no network)."""
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://flowyard.test")


@pytest.fixture
async def clients(app: FastAPI) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    made = {a: client_from(app, a) for a in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}
    yield made
    for c in made.values():
        await c.aclose()


async def login(client: httpx.AsyncClient, username: str, password: str) -> httpx.Response:
    return await client.post("/login", json={"username": username, "password": password})


def assert_throttled(r: httpx.Response) -> int:
    assert r.status_code == 429, r.text
    body = r.json()
    assert body["errors"][0]["code"] == 429
    retry = int(r.headers["Retry-After"])
    assert 1 <= retry <= WINDOW
    assert str(retry) in body["errors"][0]["message"]
    return retry


async def end_windows(db: Database) -> None:
    """Move every window into the past, as if WINDOW seconds had gone by."""
    async with db.write() as session:
        await session.execute(
            sa.update(LoginThrottle).values(window_start=utcnow() - timedelta(seconds=WINDOW + 1))
        )


async def test_wrong_passwords_get_429_then_the_window_ends(
    clients: dict[str, httpx.AsyncClient], factory: Factory, db: Database
) -> None:
    c = clients["127.0.0.2"]
    user = await factory.user()
    for _ in range(PER_USER):
        assert (await login(c, user.username, "wrong password")).status_code == 401
    # Throttled, even with the right password and from another address.
    assert_throttled(await login(c, user.username, user.password))
    assert_throttled(await login(clients["127.0.0.3"], user.username.upper(), user.password))
    await end_windows(db)
    r = await login(c, user.username, user.password)
    assert r.status_code == 200, r.text
    # A success starts the username afresh.
    for _ in range(PER_USER - 1):
        assert (await login(c, user.username, "wrong again")).status_code == 401
    assert (await login(c, user.username, user.password)).status_code == 200


async def test_another_username_from_the_same_address_is_throttled(
    clients: dict[str, httpx.AsyncClient], factory: Factory
) -> None:
    a, b, victim = await factory.user(), await factory.user(), await factory.user()
    c = clients["127.0.0.2"]
    for _ in range(PER_USER):
        assert (await login(c, a.username, "wrong")).status_code == 401
    for _ in range(PER_ADDRESS - PER_USER):
        assert (await login(c, b.username, "wrong")).status_code == 401
    # victim has not failed once; its attempt is refused by the address rule alone.
    assert_throttled(await login(c, victim.username, victim.password))
    assert_throttled(await login(c, "nobody@example.com", "whatever"))
    # From another address the same username logs in.
    assert (await login(clients["127.0.0.3"], victim.username, victim.password)).status_code == 200


async def test_successful_logins_do_not_use_up_the_address(
    clients: dict[str, httpx.AsyncClient], factory: Factory
) -> None:
    user = await factory.user()
    c = clients["127.0.0.2"]
    for _ in range(PER_ADDRESS * 2):
        assert (await login(c, user.username, user.password)).status_code == 200


async def test_unknown_usernames_are_throttled_like_known_ones(
    clients: dict[str, httpx.AsyncClient], factory: Factory
) -> None:
    known = await factory.user()
    answers = {}
    for name, address in ((known.username, "127.0.0.2"), ("ghost@example.com", "127.0.0.3")):
        c = clients[address]
        seen = [await login(c, name, "wrong password") for _ in range(PER_USER + 1)]
        answers[name] = [
            (r.status_code, re.sub(r"\d+", "N", r.text), "retry-after" in r.headers) for r in seen
        ]
    assert answers[known.username] == answers["ghost@example.com"]
    assert [s for s, _, _ in answers[known.username]] == [401] * PER_USER + [429]


async def test_api_processes_share_the_count(
    settings: Settings, db: Database, registry: Registry, factory: Factory
) -> None:
    """Two apps (as two API processes) on one database; concurrent guesses never exceed the limit."""
    user = await factory.user()
    apps = [create_app(settings, db=db, registry=registry, run_engine=False) for _ in range(2)]
    clients = [client_from(app, f"127.0.0.{5 + i}") for i, app in enumerate(apps)]
    try:
        answers = await asyncio.gather(
            *(login(clients[i % 2], user.username, "wrong password") for i in range(PER_USER * 3))
        )
        codes = sorted(r.status_code for r in answers)
        assert codes == [401] * PER_USER + [429] * (PER_USER * 2)
        assert_throttled(await login(clients[1], user.username, user.password))
    finally:
        for c in clients:
            await c.aclose()


async def test_throttling_can_be_switched_off(
    tmp_path: Path, db_url: str, db: Database, registry: Registry, factory: Factory
) -> None:
    settings = Settings(
        data_dir=tmp_path, database_url=db_url, login_max_failures=0, login_max_failures_per_address=0
    )
    user = await factory.user()
    async with client_from(
        create_app(settings, db=db, registry=registry, run_engine=False), "127.0.0.2"
    ) as c:
        for _ in range(8):
            assert (await login(c, user.username, "wrong")).status_code == 401
        assert (await login(c, user.username, user.password)).status_code == 200
