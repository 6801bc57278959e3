"""search keys: the SQLite search index reads integers in id order, not the indexed text

SQLite only (PostgreSQL's trigram indexes of migration 0008 are unchanged). Migration 0008's
FTS5 table ``<table>_search(id, name_lc, description_lc)`` gave a search's candidates as rowids
whose object id had to be read from the FTS table's own copy of the text (the row holding the
name and description: ~6 ms for 4,449 candidates at 100,000 flows), then re-checked with
``LIKE`` on that same text, then sorted. It is replaced by:

- ``<table>_search_keys (key INTEGER PRIMARY KEY, id UNIQUE)``: one narrow row per object. The
  key is the id's creation second (its first 8 hex digits) times 2^31, plus the object's rank
  among the objects of that second (the next free number at insert), so **key order is the
  id's order, second by second**: a search reads its candidates in key order and stops once
  it has what a page and its bounded total need (``flowyard.api.listing.search_page``); only
  within one second is the order settled by the ids themselves.
- ``<table>_search (name_lc, description_lc)``: the FTS5 table (``trigram``, case-sensitive,
  over the lower-cased copies) whose rowid **is** that key. A phrase query of three characters
  or more is exactly a substring test (consecutive trigrams), so no ``LIKE`` re-check reads the
  text again (tests/api/test_search_index.py holds it to the plain ``LIKE`` on both databases).

Three triggers on ``<table>`` keep both in step, as 0008's did. A later migration that rebuilds
``flows`` or ``templates`` on SQLite (``batch_alter_table`` with a table copy) drops these
triggers with the old table: it must call ``create_triggers`` below again. The downgrade
restores 0008's structure.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 15:40:00.000000
"""

from __future__ import annotations

from alembic import op

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

TABLES = ("flows", "templates")
# 2^31: the keys one second of ids can take (a key fits SQLite's signed 64 bits up to the last
# second 0xffffffff).
SECOND_SPAN = 1 << 31
_HEX = "0123456789abcdef"


def second_of(column: str) -> str:
    """SQL for the creation second of the 24-hex-digit id in ``column``: its first 8 hex digits
    as an integer (SQLite 3.40 has no ``unhex``; ids are lowercase hex, ``flowyard.ids``)."""
    terms = [f"((instr('{_HEX}', substr({column}, {i + 1}, 1)) - 1) << {4 * (7 - i)})" for i in range(8)]
    return "(" + " + ".join(terms) + ")"


def _triggers(table: str, *, insert: str, delete: str) -> None:
    """The three triggers on ``table`` that keep its search index in step (both structures): an
    update of the indexed columns is a delete then an insert."""
    fts = f"{table}_search"
    op.execute(f"CREATE TRIGGER {fts}_insert AFTER INSERT ON {table} BEGIN {insert} END")
    op.execute(f"CREATE TRIGGER {fts}_delete AFTER DELETE ON {table} BEGIN {delete} END")
    op.execute(
        f"CREATE TRIGGER {fts}_update AFTER UPDATE OF id, name_lc, description_lc ON {table} "
        "WHEN old.id IS NOT new.id OR old.name_lc IS NOT new.name_lc "
        f"OR old.description_lc IS NOT new.description_lc BEGIN {delete} {insert} END"
    )


def create_triggers(table: str) -> None:
    fts, keys = f"{table}_search", f"{table}_search_keys"
    # The next free key of the id's second: max + 1 within the second's span, or its first.
    insert = (
        f"INSERT INTO {keys} (key, id) SELECT coalesce((SELECT max(key) + 1 FROM {keys} "
        f"WHERE key BETWEEN lo AND lo + {SECOND_SPAN - 1}), lo), new.id "
        f"FROM (SELECT {second_of('new.id')} * {SECOND_SPAN} AS lo);"
        f"INSERT INTO {fts} (rowid, name_lc, description_lc) "
        f"SELECT key, new.name_lc, new.description_lc FROM {keys} WHERE id = new.id;"
    )
    delete = (
        f"DELETE FROM {fts} WHERE rowid = (SELECT key FROM {keys} WHERE id = old.id);"
        f"DELETE FROM {keys} WHERE id = old.id;"
    )
    _triggers(table, insert=insert, delete=delete)


def create_sqlite(table: str) -> None:
    fts, keys = f"{table}_search", f"{table}_search_keys"
    op.execute(f"CREATE TABLE {keys} (key INTEGER PRIMARY KEY, id VARCHAR(24) NOT NULL UNIQUE)")
    op.execute(
        f"CREATE VIRTUAL TABLE {fts} USING fts5"
        "(name_lc, description_lc, tokenize = 'trigram case_sensitive 1')"
    )
    # Keys for what is already there: within a second, numbered in id order.
    op.execute(
        f"INSERT INTO {keys} (key, id) SELECT {second_of('id')} * {SECOND_SPAN} "
        f"+ row_number() OVER (PARTITION BY substr(id, 1, 8) ORDER BY id) - 1, id FROM {table}"
    )
    op.execute(
        f"INSERT INTO {fts} (rowid, name_lc, description_lc) "
        f"SELECT k.key, t.name_lc, t.description_lc FROM {table} t JOIN {keys} k ON k.id = t.id"
    )
    create_triggers(table)


def drop_sqlite(table: str) -> None:
    fts = f"{table}_search"
    for event in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS {fts}_{event}")
    op.execute(f"DROP TABLE IF EXISTS {fts}")
    op.execute(f"DROP TABLE IF EXISTS {fts}_keys")


def _create_0008(table: str) -> None:
    # Migration 0008's structure, for the downgrade (kept here: a migration's code is frozen).
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
    delete = f"""DELETE FROM {fts} WHERE id MATCH '"' || old.id || '"' AND id = old.id;"""
    _triggers(table, insert=insert, delete=delete)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        drop_sqlite(table)
        create_sqlite(table)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        drop_sqlite(table)
        _create_0008(table)
