"""The migration tree, on an empty SQLite file and an empty PostgreSQL database:
one head, upgrade to it matches the models exactly, down to base and up again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from flowyard.db import migrate
from flowyard.models import include_object, metadata
from tests.conftest import IN_CI, PG_ADMIN_DSN, _create_pg_database, _drop_pg_database, _pg_available


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database nobody has migrated yet (not the shared, already migrated ones)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        return
    reason = asyncio.run(_pg_available())
    if reason is not None:
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_DSN} is required in CI: {reason}")
        pytest.skip(f"PostgreSQL not reachable ({reason})")
    url = _create_pg_database()
    yield url
    _drop_pg_database(url)


def _in_sync(url: str, fn: Any) -> Any:
    async def run() -> Any:
        engine = create_async_engine(url, poolclass=sa.pool.NullPool)
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(fn)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _tables(url: str) -> set[str]:
    return _in_sync(url, lambda conn: set(sa.inspect(conn).get_table_names()))


def _current(url: str) -> str | None:
    return _in_sync(url, lambda conn: MigrationContext.configure(conn).get_current_revision())


def _diff(url: str) -> list[Any]:
    def compare(conn: sa.Connection) -> list[Any]:
        context = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "compare_server_default": True, "include_object": include_object},
        )
        return compare_metadata(context, metadata)

    return _in_sync(url, compare)


def test_exactly_one_head() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config("sqlite+aiosqlite://"))
    heads = script.get_heads()
    assert len(heads) == 1, heads
    # Every revision reachable from the head, down to a single base.
    assert len(script.get_bases()) == 1
    assert len(list(script.walk_revisions())) >= 1


def test_upgrade_matches_models_and_round_trips(empty_url: str) -> None:
    head = ScriptDirectory.from_config(migrate.alembic_config(empty_url)).get_current_head()
    assert _tables(empty_url) == set()

    migrate.upgrade(empty_url)
    assert _current(empty_url) == head
    expected = {t.name for t in metadata.sorted_tables}
    assert expected <= _tables(empty_url)
    assert _diff(empty_url) == []

    # Upgrading again is a no-op.
    migrate.upgrade(empty_url)
    assert _current(empty_url) == head

    migrate.downgrade(empty_url, "base")
    assert _current(empty_url) is None
    assert _tables(empty_url) <= {"alembic_version"}

    migrate.upgrade(empty_url)
    assert _current(empty_url) == head
    assert _diff(empty_url) == []


def test_search_indexes_without_pg_trgm_rights() -> None:
    """A role that may not create extensions still migrates to the head (0008 skips the trigram
    indexes with a warning) and can go down again; search then scans (same answers)."""
    import uuid

    import asyncpg

    reason = asyncio.run(_pg_available())
    if reason is not None:
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_DSN} is required in CI: {reason}")
        pytest.skip(f"PostgreSQL not reachable ({reason})")
    role = f"flowyard_norights_{uuid.uuid4().hex[:8]}"
    url = _create_pg_database()
    name = url.rsplit("/", 1)[1]

    async def admin(sql: str, database: str | None = None) -> Any:
        dsn = PG_ADMIN_DSN if database is None else PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + database
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE ROLE "{role}" LOGIN'))
    try:
        asyncio.run(admin(f'GRANT CREATE, USAGE ON SCHEMA public TO "{role}"', name))
        host = url.split("@", 1)[1]
        role_url = f"postgresql+asyncpg://{role}@{host}"
        migrate.upgrade(role_url)
        head = ScriptDirectory.from_config(migrate.alembic_config(role_url)).get_current_head()
        assert _current(role_url) == head
        assert asyncio.run(admin("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'", name)) == []
        assert _diff(role_url) == []
        migrate.downgrade(role_url, "base")
        assert _current(role_url) is None
    finally:
        _drop_pg_database(url)
        asyncio.run(admin(f'DROP ROLE IF EXISTS "{role}"'))
