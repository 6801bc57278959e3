"""Shared fixtures: a real SQLite file and the real PostgreSQL, migrated once per
session and emptied between tests; the app over real HTTP (ASGI) with httpx."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from flowyard.app import create_app
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.flows import counts
from flowyard.flows.models import Flow
from flowyard.iam import service as iam
from flowyard.logconfig import JsonFormatter
from flowyard.models import metadata

PG_ADMIN_DSN = os.environ.get("FLOWYARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Passwords and tokens the suite used (Factory adds every token it issues): none may appear
# in any log line of the whole session (the ``_no_secret_in_logs`` check at its end).
KNOWN_SECRETS: set[str] = {"correct horse battery", "a long admin password"}


class _LineRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # a record that cannot be formatted is logging's problem, not ours
            self.handleError(record)


@pytest.fixture(scope="session", autouse=True)
def _no_secret_in_logs() -> Iterator[None]:
    """Every log line of the session, formatted as the service would (the service's own
    loggers at INFO), is searched for the passwords and tokens the tests used."""
    recorder = _LineRecorder()
    root = logging.getLogger()
    root.addHandler(recorder)
    ours = [logging.getLogger(name) for name in ("flowyard", "uvicorn")]
    levels = [logger.level for logger in ours]
    for logger in ours:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(recorder)
        for logger, level in zip(ours, levels, strict=True):
            logger.setLevel(level)
    text = "\n".join(recorder.lines)
    leaked = sorted(secret[:8] + "..." for secret in KNOWN_SECRETS if secret and secret in text)
    assert not leaked, f"secrets in the suite's log lines: {leaked}"


async def _pg_available() -> str | None:
    try:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=3)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


def _create_pg_database() -> str:
    """A fresh database for this test session; returns its SQLAlchemy URL."""
    name = f"flowyard_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(run())
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return f"{base}/{name}"


def _drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]

    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("db") / "flowyard.db"
    url = f"sqlite+aiosqlite:///{path}"
    migrate.upgrade(url)
    return url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    reason = asyncio.run(_pg_available())
    if reason is not None:
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_DSN} is required in CI: {reason}")
        pytest.skip(f"PostgreSQL at {PG_ADMIN_DSN} not reachable ({reason}); set FLOWYARD_TEST_PG")
    url = _create_pg_database()
    migrate.upgrade(url)
    yield url
    _drop_pg_database(url)


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture(scope="session")
def registry() -> Registry:
    return Registry.load()


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    await truncate(database)
    try:
        yield database
    finally:
        await database.dispose()


async def truncate(database: Database) -> None:
    tables = list(reversed(metadata.sorted_tables))
    async with database.write() as session:
        if database.is_sqlite:
            for table in tables:
                await session.execute(table.delete())
        else:
            names = ", ".join(f'"{t.name}"' for t in tables)
            await session.execute(sa.text(f"TRUNCATE {names} CASCADE"))


@pytest.fixture
def settings(tmp_path: Path, db_url: str) -> Settings:
    return Settings(data_dir=tmp_path, database_url=db_url, session_ttl_seconds=3600)


@pytest.fixture
def app(settings: Settings, db: Database, registry: Registry) -> FastAPI:
    return create_app(settings, db=db, registry=registry, run_engine=False)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://flowyard.test") as c:
        yield c


@dataclass
class Account:
    id: str
    username: str
    token: str
    tenant: str | None
    password: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


class Factory:
    """Creates tenants and users with tokens straight through the services."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.count = 0

    async def tenant(self, name: str | None = None) -> str:
        self.count += 1
        async with self.db.write() as session:
            return (await iam.create_tenant(session, name or f"tenant-{self.count}")).id

    async def user(
        self,
        *,
        tenant: str | None = None,
        permissions: list[str] | tuple[str, ...] | None = None,
        username: str | None = None,
        password: str = "correct horse battery",
    ) -> Account:
        from flowyard.iam import permissions as perms

        self.count += 1
        granted = list(perms.MEMBER_DEFAULT if permissions is None else permissions)
        async with self.db.write() as session:
            user = await iam.create_user(
                session,
                username=username or f"user{self.count}@example.com",
                password=password,
                firstname="Test",
                lastname=f"User{self.count}",
                tenant_id=tenant,
                permissions=granted,
            )
            _token, text = await iam.issue_api_token(
                session, user, description="test", expires_at=None, permissions=None
            )
        KNOWN_SECRETS.update(s for s in (text, password) if len(s) >= 8)
        return Account(user.id, user.username, text, tenant, password)

    async def admin(self) -> Account:
        return await self.user(permissions=["all"])


@pytest.fixture
def factory(db: Database) -> Factory:
    return Factory(db)


@pytest.fixture
async def admin(factory: Factory) -> Account:
    return await factory.admin()


def flow_body(name: str = "My flow", **extra: Any) -> dict[str, Any]:
    """A valid two-node webhook flow."""
    body: dict[str, Any] = {
        "name": name,
        "description": "forwards orders",
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook", "function": "receive"},
                {"id": "out", "componentId": "log", "fields": {"level": "info"}},
            ],
            "edges": [{"source": "in", "target": "out"}],
        },
    }
    body.update(extra)
    return body


@pytest.fixture
def engine_settings(tmp_path: Path, db_url: str) -> Settings:
    """Settings for tests that run the engine: short intervals, no long sleeps."""
    return Settings(
        data_dir=tmp_path,
        database_url=db_url,
        poll_interval=0.05,
        scheduler_interval=0.2,
        lease_seconds=5,
        stop_grace_seconds=2,
        step_timeout=5,
        webhook_group_commit_ms=1,
        runners=1,  # one runner process per engine: starting them is most of an engine's start-up
    )


@pytest.fixture
async def engine_app(engine_settings: Settings, db: Database, registry: Registry) -> AsyncIterator[FastAPI]:
    app = create_app(engine_settings, db=db, registry=registry, run_engine=True)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def engine_client(engine_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=engine_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://flowyard.test") as c:
        yield c


async def wait_until(predicate: Any, within: float = 10.0, interval: float = 0.05) -> Any:
    """Poll an async predicate until it returns something truthy; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within} s (last value {value!r})")
        await asyncio.sleep(interval)


def pytest_report_header() -> str:
    """Whether the console's browser test will run (tests/console/conftest.py)."""
    from tests.console.conftest import report_header

    return report_header()


async def force_status(db: Database, flow_id: str, status: str, **more: Any) -> None:
    """Put a flow in ``status`` directly, as only the engine could (for tests that run none),
    with any other ``more`` columns: the row and the flow lists' counts (flows/counts.py), the
    two that ``flows.status.move`` writes, so the lists stay true."""
    async with db.write() as session:
        row = (await session.execute(sa.select(Flow.status, Flow.type).where(Flow.id == flow_id))).one()
        await session.execute(sa.update(Flow).where(Flow.id == flow_id).values(status=status, **more))
        owners = await counts.owner_entries(session, flow_id)
        await counts.shift(
            session,
            before=[counts.Shape(owners, row.status, row.type)],
            after=[counts.Shape(owners, status, row.type)],
        )
