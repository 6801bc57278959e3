"""Upgrading the database schema: ``flowyard migrate``, and ``flowyard serve`` at start.

``serve`` upgrades in a child process (``python -m flowyard.ops.schema``: a fresh exec of the same
Python with the same environment), so that Alembic and Mako (about 27 MiB) are never loaded into
the long-lived serve process (issue 19, docs/performance.md "Memory per process"). This module
imports only what an upgrade needs, to keep that child's start short.
"""

from __future__ import annotations

import subprocess
import sys

from flowyard.config import Settings
from flowyard.ops import OpsError


def upgrade(settings: Settings, revision: str = "head") -> None:
    """Migrate the configured database to ``revision`` (the data directory is created 0700)."""
    from flowyard.db import migrate
    from flowyard.secrets.crypto import load_key

    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The service's key: the migrations that seal stored secrets (0015) need it.
    key = load_key(settings.configured_secret_key(), settings.data_dir)
    migrate.upgrade(settings.resolved_database_url(), revision, secret_key=key)


def upgrade_apart() -> None:
    """``upgrade`` to head in a child process; its errors go to our stderr."""
    done = subprocess.run([sys.executable, "-m", __name__], check=False)
    if done.returncode != 0:
        raise OpsError(f"the schema upgrade failed (exit status {done.returncode})")


def main() -> None:
    from flowyard import logconfig

    settings = Settings()
    logconfig.setup(settings.log_format, settings.log_level)
    upgrade(settings)


if __name__ == "__main__":
    main()
