"""Migration 0023 (SQLite): flows and templates stored before it get search keys in their id's
second, numbered in id order within it, and the FTS rows keyed by them; a flow inserted after
it gets the next free key of its second from the trigger. The downgrade restores migration
0008's search table (found by id again) and the upgrade is repeatable."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync

SECOND = 0x6B157B18
# Inserted out of id order, two in one second, one in the next.
IDS = [f"{SECOND:08x}{'0' * 15}9", f"{SECOND:08x}{'0' * 15}1", f"{SECOND + 1:08x}{'0' * 16}"]
LATER = f"{SECOND:08x}{'0' * 15}5"
SPAN = 1 << 31


def _insert_flow(conn: sa.Connection, flow_id: str, name: str) -> None:
    now = "'2026-01-02 03:04:05'"
    conn.execute(
        sa.text(
            "INSERT INTO flows (id, name, name_lc, description, description_lc, type, graph,"
            " owners, status, status_changed_at, version, created_at, updated_at) VALUES"
            f" (:id, :n, :lc, 'd', 'd', 'ordinary', '{{}}', '[]', 'inactive', {now}, 1, {now}, {now})"
        ),
        {"id": flow_id, "n": name, "lc": name.lower()},
    )


def _keys(conn: sa.Connection) -> dict[str, int]:
    return dict(conn.execute(sa.text("SELECT id, key FROM flows_search_keys")).all())


def _matches(conn: sa.Connection, phrase: str) -> set[str]:
    rows = conn.execute(
        sa.text(
            "SELECT k.id FROM flows_search s JOIN flows_search_keys k ON k.key = s.rowid"
            " WHERE flows_search MATCH :p"
        ),
        {"p": f'"{phrase}"'},
    )
    return {r[0] for r in rows}


def test_existing_flows_are_keyed_in_id_order(tmp_path: Path) -> None:
    empty_url = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"  # 0023 changes SQLite's index only
    migrate.upgrade(empty_url, "0022")

    def before(conn: sa.Connection) -> None:
        for i, flow_id in enumerate(IDS):
            _insert_flow(conn, flow_id, f"Shopify {i}")
        conn.commit()

    _in_sync(empty_url, before)
    migrate.upgrade(empty_url, "0023")

    def after(conn: sa.Connection) -> tuple[dict[str, int], set[str], set[int], dict[str, int]]:
        keys = _keys(conn)
        found = _matches(conn, "shopify")
        rowids = {r[0] for r in conn.execute(sa.text("SELECT rowid FROM flows_search"))}
        _insert_flow(conn, LATER, "Later one")
        conn.commit()
        return keys, found, rowids, _keys(conn)

    keys, found, rowids, later = _in_sync(empty_url, after)
    first, second = sorted(IDS[:2])
    assert keys == {first: SECOND * SPAN, second: SECOND * SPAN + 1, IDS[2]: (SECOND + 1) * SPAN}
    assert found == set(IDS)
    assert rowids == set(keys.values())
    assert later[LATER] == SECOND * SPAN + 2  # the next free key of its second

    migrate.downgrade(empty_url, "0022")

    def old(conn: sa.Connection) -> tuple[set[str], set[str]]:
        tables = set(sa.inspect(conn).get_table_names())
        found = {
            r[0]
            for r in conn.execute(
                sa.text("SELECT id FROM flows_search WHERE flows_search MATCH :p"),
                {"p": '{name_lc description_lc} : "shopify"'},
            )
        }
        return tables, found

    tables, found = _in_sync(empty_url, old)
    assert "flows_search_keys" not in tables
    assert found == set(IDS)
    migrate.upgrade(empty_url, "0023")
    assert set(_in_sync(empty_url, _keys)) == {*IDS, LATER}
