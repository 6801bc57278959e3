"""Alembic environment: one tree for SQLite and PostgreSQL.

SQLite gets ``render_as_batch`` (ALTER TABLE support) and foreign keys off
during batch operations; PostgreSQL takes an advisory lock so several API
processes starting at once migrate one after another.
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
from flowyard.db.metadata import include_object, metadata

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
        connection.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
    try:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=is_sqlite,
            transaction_per_migration=True,
            compare_type=True,
            render_item=_render_item,
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
        if connection.in_transaction():
            connection.commit()
    finally:
        if not is_sqlite:
            connection.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
            connection.commit()


async def _main() -> None:
    engine = create_async_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=sa.pool.NullPool)
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
