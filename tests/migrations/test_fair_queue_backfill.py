"""Migration 0006 puts the unfinished executions of an existing database into their queue
groups, so fair claiming serves them (finished ones need no group)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

ROWS = [
    # id, tenant, owner_user, status, expected group
    ("a" * 24, "t1", "u1", "queued", "t:t1"),
    ("b" * 24, None, "u2", "running", "u:u2"),
    ("c" * 24, None, None, "queued", "-"),
    ("d" * 24, "t1", "u1", "succeeded", None),
]


def test_unfinished_executions_get_their_group(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0004")

    created: Any = (
        "2026-11-23 10:00:00" if empty_url.startswith("sqlite") else datetime(2026, 11, 23, tzinfo=UTC)
    )

    def insert(conn: sa.Connection) -> None:
        for eid, tenant, owner, status, _ in ROWS:
            conn.execute(
                sa.text(
                    "INSERT INTO executions (id, flow_id, flow_version, tenant, owner_user, trigger, status,"
                    " created_at, attempts) VALUES (:id, :f, 1, :t, :o, 'webhook', :s, :c, 0)"
                ),
                {"id": eid, "f": "f" * 24, "t": tenant, "o": owner, "s": status, "c": created},
            )
        conn.commit()

    _in_sync(empty_url, insert)
    migrate.upgrade(empty_url, "0006")

    def groups(conn: sa.Connection) -> dict[str, str | None]:
        return dict(conn.execute(sa.text("SELECT id, queue_group FROM executions")).all())

    assert _in_sync(empty_url, groups) == {eid: group for eid, *_, group in ROWS}
