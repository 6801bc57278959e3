"""Alembic environment: one tree for SQLite and PostgreSQL.

SQLite gets ``render_as_batch`` (ALTER TABLE support) and foreign keys off
during batch operations. PostgreSQL runs all pending migrations in one
transaction that first takes a transaction-scoped advisory lock, so several
processes starting at once migrate one after another, and nothing outlives the
transaction (PgBouncer in transaction mode may hand the next one another server
connection: a session-level lock would stay held there).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import sqlalchemy as sa
from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from flowyard.db.base import UTCDateTime
from flowyard.db.session import engine_kwargs
from flowyard.models import include_object, metadata

config = context.config
MIGRATION_LOCK = 0x466C6F77  # "Flow"


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render our column types as plain SQLAlchemy ones: migrations stay static."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    is_sqlite = connection.dialect.name == "sqlite"
    if is_sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
    else:
        # Begins the one transaction the migrations below run in (alembic sees it as the
        # caller's); the lock is released by its commit or rollback.
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=is_sqlite,
        transaction_per_migration=is_sqlite,
        compare_type=True,
        render_item=_render_item,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()


async def _main() -> None:
    url, kwargs = engine_kwargs(config.get_main_option("sqlalchemy.url") or "")
    engine = create_async_engine(url, poolclass=sa.pool.NullPool, **kwargs)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_main())
