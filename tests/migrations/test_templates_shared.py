"""Migration 0017: templates stored without owners were visible to every holder of
flowTemplates.read; they are marked ``shared`` so they stay so. Owned templates are not shared."""

from __future__ import annotations

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

OWNERLESS, OWNED_BY_USER, OWNED_BY_TENANT = "a" * 24, "b" * 24, "c" * 24


def _insert(url: str) -> None:
    sqlite = url.startswith("sqlite")
    now = "'2026-01-02 03:04:05'" if sqlite else "CAST('2026-01-02 03:04:05+00' AS timestamptz)"

    def js(text: str) -> str:
        return f"'{text}'" if sqlite else f"CAST('{text}' AS json)"

    owners = {
        OWNERLESS: [],
        OWNED_BY_USER: [("user", "d" * 24)],
        OWNED_BY_TENANT: [("tenant", "e" * 24)],
    }

    def insert(conn: sa.Connection) -> None:
        for tid, entries in owners.items():
            listed = ",".join(f'{{"id": "{i}", "type": "{t}"}}' for t, i in entries)
            conn.execute(
                sa.text(
                    "INSERT INTO templates (id, name, name_lc, type, graph, owners, status, tags,"
                    f" created_at, updated_at) VALUES (:id, 't', 't', 'ordinary', {js('{}')},"
                    f" {js('[' + listed + ']')}, 'published', {js('[]')}, {now}, {now})"
                ),
                {"id": tid},
            )
            for t, i in entries:
                conn.execute(
                    sa.text(
                        "INSERT INTO template_owners (template_id, owner_type, owner_id) VALUES (:a, :b, :c)"
                    ),
                    {"a": tid, "b": t, "c": i},
                )
        conn.commit()

    _in_sync(url, insert)


def _shared(url: str) -> dict[str, bool]:
    def read(conn: sa.Connection) -> dict[str, bool]:
        return {tid: bool(s) for tid, s in conn.execute(sa.text("SELECT id, shared FROM templates"))}

    return _in_sync(url, read)


def test_ownerless_templates_become_shared_and_owned_ones_do_not(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0016")
    _insert(empty_url)
    migrate.upgrade(empty_url, "0017")
    assert _shared(empty_url) == {OWNERLESS: True, OWNED_BY_USER: False, OWNED_BY_TENANT: False}
    migrate.downgrade(empty_url, "0016")

    def columns(conn: sa.Connection) -> set[str]:
        return {c["name"] for c in sa.inspect(conn).get_columns("templates")}

    assert "shared" not in _in_sync(empty_url, columns)
    migrate.upgrade(empty_url, "0017")
    assert _shared(empty_url)[OWNERLESS] is True
