"""Migration 0009 sums the existing daily counters into their ISO weeks and calendar months,
with the attributes the engine's upserts would have left: a flow's latest day's tenant, user
and name (the daily upsert replaces them), a component row's earliest (it keeps them)."""

from __future__ import annotations

from datetime import date
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

F1, F2 = "1" * 24, "2" * 24
FLOW_DAYS = [
    # day, flow, tenant, user, name, executions
    (date(2025, 12, 28), F1, None, "u1", "old name", 2),  # Sunday: ISO week of Dec 22
    (date(2025, 12, 29), F1, None, "u1", "old name", 3),  # Monday: week of Dec 29, crossing the year
    (date(2026, 1, 1), F1, None, "u2", "new name", 5),  # owner and name changed
    (date(2026, 1, 4), F1, None, "u2", "new name", 7),
    (date(2026, 1, 5), F2, "t1", "u3", "other", 11),
]
COMPONENT_DAYS = [
    # day, component, flow, tenant, user, steps
    (date(2025, 12, 29), "log", F1, None, "u1", 4),
    (date(2026, 1, 1), "log", F1, None, "u2", 6),
    (date(2026, 1, 5), "http", F2, "t1", "u3", 8),
]


def test_rollups_are_backfilled_from_daily_rows(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0007")
    sqlite = empty_url.startswith("sqlite")

    def day(d: date) -> Any:
        return d.isoformat() if sqlite else d

    def insert(conn: sa.Connection) -> None:
        for d, fid, tenant, user, name, n in FLOW_DAYS:
            conn.execute(
                sa.text(
                    "INSERT INTO flow_day_counts (day, flow_id, tenant, user_id, flow_name, executions)"
                    " VALUES (:d, :f, :t, :u, :name, :n)"
                ),
                {"d": day(d), "f": fid, "t": tenant, "u": user, "name": name, "n": n},
            )
        for d, cid, fid, tenant, user, n in COMPONENT_DAYS:
            conn.execute(
                sa.text(
                    "INSERT INTO component_day_counts (day, component_id, flow_id, tenant, user_id, steps)"
                    " VALUES (:d, :c, :f, :t, :u, :n)"
                ),
                {"d": day(d), "c": cid, "f": fid, "t": tenant, "u": user, "n": n},
            )
        conn.commit()

    _in_sync(empty_url, insert)
    migrate.upgrade(empty_url, "0009")

    def read(conn: sa.Connection) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
        flows = conn.execute(
            sa.text(
                "SELECT period, start, flow_id, tenant, user_id, flow_name, executions"
                " FROM flow_period_counts"
            )
        ).all()
        comps = conn.execute(
            sa.text(
                "SELECT period, start, component_id, flow_id, tenant, user_id, steps"
                " FROM component_period_counts"
            )
        ).all()
        norm = lambda rows: {(r[0], str(r[1]), *r[2:]) for r in rows}  # noqa: E731
        return norm(flows), norm(comps)

    flows, comps = _in_sync(empty_url, read)
    assert flows == {
        ("week", "2025-12-22", F1, None, "u1", "old name", 2),
        ("week", "2025-12-29", F1, None, "u2", "new name", 3 + 5 + 7),
        ("week", "2026-01-05", F2, "t1", "u3", "other", 11),
        ("month", "2025-12-01", F1, None, "u1", "old name", 2 + 3),
        ("month", "2026-01-01", F1, None, "u2", "new name", 5 + 7),
        ("month", "2026-01-01", F2, "t1", "u3", "other", 11),
    }
    assert comps == {
        ("week", "2025-12-29", "log", F1, None, "u1", 4 + 6),
        ("week", "2026-01-05", "http", F2, "t1", "u3", 8),
        ("month", "2025-12-01", "log", F1, None, "u1", 4),
        ("month", "2026-01-01", "log", F1, None, "u2", 6),
        ("month", "2026-01-01", "http", F2, "t1", "u3", 8),
    }

    migrate.downgrade(empty_url, "0007")

    def tables(conn: sa.Connection) -> set[str]:
        return set(sa.inspect(conn).get_table_names())

    assert not {"flow_period_counts", "component_period_counts"} & _in_sync(empty_url, tables)
