"""PostgreSQL's pool pings a connection only when it sat idle (``db.session._ping_when_idle``),
not at every checkout; a connection the server closed is still never handed to a request:

- idle past ``PING_IDLE_SECONDS``: its ping fails at checkout and the pool opens a new one, so a
  session's statements run (a restart, a failover or an idle timeout closed it unseen);
- used within that time: a single-statement read (``db.fast.Fetch``) meets the closed connection
  and runs once more on a new one;
- under load: connections back in the pool within the idle time are not pinged (no ping's
  round trips in a busy pool).

The server side is real: the pooled backend is ended with ``pg_terminate_backend`` from another
connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from flowyard.components.registry import Registry
from flowyard.db import session as db_session
from flowyard.db.session import Database
from flowyard.flows import service as flows
from flowyard.flows.models import Flow
from flowyard.iam.principal import Principal
from tests.conftest import flow_body

ADMIN = Principal("a" * 24, "admin@example.com", None, frozenset({"all"}), "")
PID = sa.text("SELECT pg_backend_pid()")


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[Database]:
    db = Database(postgres_url)
    try:
        yield db
    finally:
        await db.dispose()


async def _terminate(url: str, pid: int) -> None:
    """End the backend ``pid`` from a connection outside the pool under test."""
    engine = create_async_engine(url, poolclass=sa.pool.NullPool)
    try:
        async with engine.connect() as conn:
            ended = await conn.scalar(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            assert ended is True
            for _ in range(100):  # until the server has let it go
                gone = await conn.scalar(
                    sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
                )
                if gone == 0:
                    return
                await asyncio.sleep(0.02)
    finally:
        await engine.dispose()


def _count_pings(db: Database) -> list[int]:
    pings: list[int] = []
    dialect: Any = db.engine.sync_engine.dialect
    original = dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pings.append(1)
        return bool(original(dbapi_connection))

    dialect.do_ping = counted
    return pings


async def test_an_idle_connection_the_server_closed_is_replaced_at_checkout(
    pg: Database, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_session, "PING_IDLE_SECONDS", 0.05)
    async with pg.read() as session:
        pid = await session.scalar(PID)
    await _terminate(postgres_url, pid)
    await asyncio.sleep(0.1)  # idle past PING_IDLE_SECONDS
    async with pg.read() as session:
        assert await session.scalar(sa.text("SELECT 1")) == 1  # not a closed connection's error
        assert await session.scalar(PID) != pid


async def test_a_busy_pool_is_not_pinged(pg: Database) -> None:
    pings = _count_pings(pg)
    for _ in range(20):
        async with pg.read() as session:
            await session.scalar(sa.text("SELECT 1"))
    assert pings == []


async def test_an_idle_pool_is_pinged(pg: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_session, "PING_IDLE_SECONDS", 0.05)
    async with pg.read() as session:
        await session.scalar(sa.text("SELECT 1"))
    pings = _count_pings(pg)
    await asyncio.sleep(0.1)
    async with pg.read() as session:
        await session.scalar(sa.text("SELECT 1"))
    assert pings == [1]


async def test_a_read_outlives_a_connection_closed_right_after_its_use(
    pg: Database, postgres_url: str, registry: Registry
) -> None:
    made = flows.prepare_new_flow(ADMIN, flow_body("outlives"), registry)
    async with pg.write() as session:
        await flows.insert_flows(session, [made])
    try:
        assert (await flows.read_flow(pg, ADMIN, made.id))["name"] == "outlives"
        async with pg.engine.connect() as conn:  # the pooled connection the read used
            pid = await conn.scalar(PID)
        await _terminate(postgres_url, pid)
        # Within PING_IDLE_SECONDS of its use: no ping; the read meets it and goes again.
        assert (await flows.read_flow(pg, ADMIN, made.id))["name"] == "outlives"
        async with pg.engine.connect() as conn:
            assert await conn.scalar(PID) != pid
    finally:
        async with pg.write() as session:
            await session.execute(sa.delete(Flow).where(Flow.id == made.id))
