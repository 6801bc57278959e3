"""trigram indexes for ``search`` on flows and templates

SQLite: an FTS5 table ``<table>_search(id, name_lc, description_lc)`` with the ``trigram``
tokenizer (case-sensitive: it indexes the already lower-cased copies), filled from the table and
kept in step by three triggers. It stores its own copy of the text and finds a row to delete by
its id (a phrase query on the indexed ``id`` column, confirmed by equality), never by the base
table's implicit rowid, which ``VACUUM`` may renumber.

PostgreSQL: ``CREATE EXTENSION IF NOT EXISTS pg_trgm`` and GIN ``gin_trgm_ops`` indexes on
``name_lc`` and ``description_lc``, which serve the ``LIKE '%…%'`` the services already send.
If the extension cannot be created (a role without the right), the migration logs a warning and
goes on without the indexes: search still answers, by a scan. The downgrade leaves the
extension in place (other objects may use it).

A later migration that rebuilds ``flows`` or ``templates`` on SQLite (``batch_alter_table``
with a table copy) drops these triggers with the old table: it must recreate them
(``create_sqlite(...)`` below) and rebuild the FTS content. Migration 0023 replaced this
structure (search keys in id order): after it, recreate its triggers (``create_triggers``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 20:40:00.000000
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLES = ("flows", "templates")
log = logging.getLogger("alembic.runtime.migration")


def create_sqlite(table: str) -> None:
    fts = f"{table}_search"
    op.execute(
        f"CREATE VIRTUAL TABLE {fts} USING fts5"
        "(id, name_lc, description_lc, tokenize = 'trigram case_sensitive 1')"
    )
    op.execute(
        f"INSERT INTO {fts} (id, name_lc, description_lc) SELECT id, name_lc, description_lc FROM {table}"
    )
    insert = (
        f"INSERT INTO {fts} (id, name_lc, description_lc) VALUES (new.id, new.name_lc, new.description_lc);"
    )
    # The phrase query finds the row through the index; "id = old.id" keeps it to equality.
    delete = f"""DELETE FROM {fts} WHERE id MATCH '"' || old.id || '"' AND id = old.id;"""
    op.execute(f"CREATE TRIGGER {fts}_insert AFTER INSERT ON {table} BEGIN {insert} END")
    op.execute(f"CREATE TRIGGER {fts}_delete AFTER DELETE ON {table} BEGIN {delete} END")
    op.execute(
        f"CREATE TRIGGER {fts}_update AFTER UPDATE OF id, name_lc, description_lc ON {table} "
        "WHEN old.id IS NOT new.id OR old.name_lc IS NOT new.name_lc "
        f"OR old.description_lc IS NOT new.description_lc BEGIN {delete} {insert} END"
    )


def drop_sqlite(table: str) -> None:
    fts = f"{table}_search"
    for event in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS {fts}_{event}")
    op.execute(f"DROP TABLE IF EXISTS {fts}")


def _create_pg_trgm() -> bool:
    conn = op.get_bind()
    try:
        with conn.begin_nested():
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except sa.exc.DBAPIError as exc:
        log.warning(
            "pg_trgm could not be created (%s); search will scan. Create it as a superuser "
            "and the indexes of migration 0008 (see docs/performance.md).",
            str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__,
        )
        return False
    return True


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for table in TABLES:
            create_sqlite(table)
        return
    if not _create_pg_trgm():
        return
    for table in TABLES:
        for column in ("name_lc", "description_lc"):
            op.execute(
                f"CREATE INDEX IF NOT EXISTS ix_{table}_{column}_trgm ON {table} "
                f"USING gin ({column} gin_trgm_ops)"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for table in TABLES:
            drop_sqlite(table)
        return
    for table in TABLES:
        for column in ("name_lc", "description_lc"):
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_{column}_trgm")
