"""Run Alembic programmatically (``flowyard migrate``, ``serve`` and the tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection, make_url

from flowyard.db.session import incremental_auto_vacuum, private_sqlite_files

_HERE = Path(__file__).parent


def alembic_config(url: str) -> Config:
    cfg = Config(str(_HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head", *, secret_key: bytes | None = None) -> None:
    """Migrate to ``revision``. Must not run inside an event loop (env.py starts one).

    ``secret_key``: the service's key (``secrets.crypto.load_key``), for the migrations that
    seal stored secrets (0015, the flows' webhook secrets); needed only when there are any."""
    cfg = alembic_config(url)
    cfg.attributes["flowyard_secret_key"] = secret_key
    parsed = make_url(url)
    database = parsed.database
    if (
        parsed.get_backend_name() == "sqlite"
        and database
        and database != ":memory:"
        and "mode=memory" not in url
    ):
        private_sqlite_files(Path(database))  # created 0600 here when the migration is first
        incremental_auto_vacuum(Path(database))  # a new file: pruning can shrink it
    command.upgrade(cfg, revision)


def downgrade(url: str, revision: str, *, secret_key: bytes | None = None) -> None:
    cfg = alembic_config(url)
    cfg.attributes["flowyard_secret_key"] = secret_key
    command.downgrade(cfg, revision)


async def upgrade_async(url: str, revision: str = "head", *, secret_key: bytes | None = None) -> None:
    """From async code: run the migration in a thread with its own event loop."""
    await asyncio.to_thread(lambda: upgrade(url, revision, secret_key=secret_key))


def script_head() -> str:
    """The revision this code's migrations end at."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def pending_revisions(current: str | None) -> list[str]:
    """Revisions ``flowyard migrate`` would apply to a database at ``current``, oldest first.

    Raises ``LookupError`` for a revision these migrations do not know (a database written by
    a newer flowyard)."""
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    if current is not None:
        try:
            scripts.get_revision(current)
        except CommandError:
            raise LookupError(current) from None
    revisions = scripts.iterate_revisions("heads", current or "base")
    return [r.revision for r in reversed(list(revisions))]


def current_revision(connection: Connection) -> str | None:
    """The revision recorded in a database (``None``: never migrated)."""
    return MigrationContext.configure(connection).get_current_revision()
