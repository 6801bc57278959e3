"""Run Alembic programmatically (``flowyard migrate``, ``serve`` and the tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

_HERE = Path(__file__).parent


def alembic_config(url: str) -> Config:
    cfg = Config(str(_HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``. Must not run inside an event loop (env.py starts one)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


async def upgrade_async(url: str, revision: str = "head") -> None:
    """From async code: run the migration in a thread with its own event loop."""
    await asyncio.to_thread(upgrade, url, revision)
