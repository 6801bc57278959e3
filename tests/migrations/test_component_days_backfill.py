"""Migration 0012 records, on each component rollup row, the days of its week or month on
which the component ran in the flow (bit i for the period's i-th day), from the daily rows;
the downgrade drops them and the rollups stay."""

from __future__ import annotations

from datetime import date
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

F1, F2 = "1" * 24, "2" * 24
COMPONENT_DAYS = [
    # day, component, flow, tenant, user, steps
    (date(2025, 12, 28), "log", F1, None, "u1", 1),  # Sunday: 7th day of the week of Dec 22
    (date(2025, 12, 29), "log", F1, None, "u1", 4),  # Monday: 1st day of the week of Dec 29
    (date(2025, 12, 31), "log", F1, None, "u1", 2),  # 31st day of December
    (date(2026, 1, 1), "log", F1, None, "u2", 6),  # Thursday, 1st of January
    (date(2026, 1, 1), "http", F2, "t1", "u3", 3),
    (date(2026, 1, 5), "http", F2, "t1", "u3", 8),
]


def test_days_are_backfilled_from_daily_rows(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0007")
    sqlite = empty_url.startswith("sqlite")

    def insert(conn: sa.Connection) -> None:
        for d, cid, fid, tenant, user, n in COMPONENT_DAYS:
            conn.execute(
                sa.text(
                    "INSERT INTO component_day_counts (day, component_id, flow_id, tenant, user_id, steps)"
                    " VALUES (:d, :c, :f, :t, :u, :n)"
                ),
                {"d": d.isoformat() if sqlite else d, "c": cid, "f": fid, "t": tenant, "u": user, "n": n},
            )
        conn.commit()

    def read(conn: sa.Connection) -> set[tuple[Any, ...]]:
        rows = conn.execute(
            sa.text("SELECT period, start, component_id, flow_id, steps, days FROM component_period_counts")
        ).all()
        return {(r[0], str(r[1]), *r[2:]) for r in rows}

    _in_sync(empty_url, insert)
    migrate.upgrade(empty_url, "0012")
    expected = {
        ("week", "2025-12-22", "log", F1, 1, 1 << 6),
        ("week", "2025-12-29", "log", F1, 4 + 2 + 6, 1 << 0 | 1 << 2 | 1 << 3),
        ("week", "2025-12-29", "http", F2, 3, 1 << 3),
        ("week", "2026-01-05", "http", F2, 8, 1 << 0),
        ("month", "2025-12-01", "log", F1, 1 + 4 + 2, 1 << 27 | 1 << 28 | 1 << 30),
        ("month", "2026-01-01", "log", F1, 6, 1 << 0),
        ("month", "2026-01-01", "http", F2, 3 + 8, 1 << 0 | 1 << 4),
    }
    assert _in_sync(empty_url, read) == expected

    migrate.downgrade(empty_url, "0011")

    def columns(conn: sa.Connection) -> set[str]:
        return {c["name"] for c in sa.inspect(conn).get_columns("component_period_counts")}

    assert "days" not in _in_sync(empty_url, columns)
    assert (
        len(
            _in_sync(
                empty_url, lambda conn: conn.execute(sa.text("SELECT * FROM component_period_counts")).all()
            )
        )
        == 7
    )
    migrate.upgrade(empty_url, "0012")
    assert _in_sync(empty_url, read) == expected
