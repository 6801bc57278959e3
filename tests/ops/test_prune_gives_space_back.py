"""Pruning hands the space it frees back to the file system (issue 19): flowyard creates a
new SQLite file in incremental auto-vacuum mode, and the pruner returns the freed pages in
short transactions. A file made before keeps its size (and works) until converted."""

from __future__ import annotations

import secrets
import sqlite3
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.logs.models import LogEntry
from flowyard.queue import pruner

ROWS = 3000


def _mode(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])


def _settled_size(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


async def _fill_and_prune(path: Path) -> tuple[int, int, dict[str, int]]:
    db = Database(f"sqlite+aiosqlite:///{path}")
    old = utcnow() - timedelta(days=40)
    async with db.write() as session:
        session.add_all(
            # Data that does not deflate (logs.data is packed on SQLite): ~2 KiB stored each.
            LogEntry(
                timestamp=old, level="info", message=f"old {i}", data={"blob": secrets.token_urlsafe(1500)}
            )
            for i in range(ROWS)
        )
        session.add(LogEntry(timestamp=utcnow(), level="info", message="recent", data={"keep": True}))
    full = _settled_size(path)
    counts = await pruner.prune(db, retention=timedelta(days=30), batch=500)
    async with db.read() as session:
        kept = (await session.execute(sa.select(LogEntry.message))).scalars().all()
    assert kept == ["recent"]  # what pruning keeps is untouched
    await db.dispose()
    return full, _settled_size(path), counts


async def test_a_new_file_shrinks_after_pruning(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    await migrate.upgrade_async(f"sqlite+aiosqlite:///{path}")
    assert _mode(path) == 2  # INCREMENTAL
    full, after, counts = await _fill_and_prune(path)
    assert counts["logs"] == ROWS
    freed = counts["pages_given_back"]
    assert freed > 0
    assert full - after >= freed * 4096 * 0.9  # the file really shrank by what was handed back
    assert after < full / 3  # ~6 MiB of old logs gone from a file that held little else
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] < 50


async def test_a_file_made_before_keeps_working_at_its_size(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # an existing database, in SQLite's default mode
        conn.execute("CREATE TABLE placeholder (k INTEGER)")
    await migrate.upgrade_async(f"sqlite+aiosqlite:///{path}")
    assert _mode(path) == 0  # NONE: not changed behind the operator's back
    full, after, counts = await _fill_and_prune(path)
    assert counts["logs"] == ROWS and counts["pages_given_back"] == 0
    assert after == full  # the pages stay free inside the file, for SQLite to reuse
