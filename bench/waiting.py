"""The resumer's query at scale (SPEC §11): 100,000 waiting executions (and as many finished
ones as history), on SQLite or PostgreSQL. Prints the plan of the due-executions query
(``queue.store.resume_due``) and times one resume batch (500 due rows moved waiting -> queued,
in a transaction rolled back so every repeat sees the same rows), and the next-due probe.

    .venv/bin/python bench/waiting.py [--database-url postgresql+asyncpg://postgres@127.0.0.1/db] \
        [--waiting 100000] [--history 100000] [--due 2000] [--repeat 20]

Without --database-url, a temporary SQLite file. A PostgreSQL database must exist and be
empty; it is migrated here.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import utcnow
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.ids import new_id
from flowyard.queue import store as queue
from flowyard.queue.models import Execution

_BATCH = 5000


async def _fill(db: Database, waiting: int, history: int, due: int) -> None:
    now = utcnow()
    table = Execution.__table__
    rows = []
    for i in range(waiting + history):
        is_waiting = i < waiting
        rows.append(
            {
                "id": new_id(),
                "flow_id": "f" * 24,
                "flow_version": 1,
                "tenant": f"t{i % 10}",
                "owner_user": "u" * 24,
                "queue_group": f"t:t{i % 10}",
                "trigger": "webhook",
                "status": "waiting" if is_waiting else "succeeded",
                "input": {"i": i},
                "attempts": 0,
                "created_at": now,
                # due: the first ``due`` ones are past due; the rest spread over the next day.
                "resume_at": (
                    now - timedelta(seconds=1) if i < due else now + timedelta(seconds=1 + i % 86400)
                )
                if is_waiting
                else None,
                "finished_at": None if is_waiting else now,
                "state": {"v": 1, "pending": [], "steps": []} if is_waiting else None,
            }
        )
        if len(rows) >= _BATCH:
            async with db.write() as session:
                await session.execute(sa.insert(table), rows)
            rows = []
    if rows:
        async with db.write() as session:
            await session.execute(sa.insert(table), rows)


async def main(args: argparse.Namespace) -> None:
    await migrate.upgrade_async(args.database_url)
    db = Database(args.database_url)
    try:
        started = time.perf_counter()
        await _fill(db, args.waiting, args.history, args.due)
        async with db.engine.connect() as conn:
            await conn.execute(sa.text("ANALYZE"))
            await conn.commit()
        name = db.engine.dialect.name
        print(
            f"{args.waiting} waiting ({args.due} due) + {args.history} finished executions "
            f"loaded in {time.perf_counter() - started:.0f} s; {name}"
        )
        async with db.engine.connect() as conn:
            session = AsyncSession(bind=conn)
            stmt = queue.due_query(session)
            params = {"now": utcnow(), "n": 500}
            compiled = str(stmt)
            if name == "sqlite":
                plan = await conn.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + compiled.replace(":now", "?").replace(":n", "?"),
                    (utcnow().replace(tzinfo=None).isoformat(sep=" "), 500),
                )
                print("plan:", *(f"  {row[-1]}" for row in plan.all()), sep="\n")
            else:
                text = compiled.replace(":now", "now()").replace(":n", "500")
                plan = await conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + text)
                print("plan:", *(f"  {row[0]}" for row in plan.all()), sep="\n")
            await conn.rollback()
        times = []
        for _ in range(args.repeat):
            async with db.engine.connect() as conn:
                trans = await conn.begin()
                session = AsyncSession(bind=conn)
                t0 = time.perf_counter()
                moved = await queue.resume_due(session, limit=500, now=params["now"])
                times.append((time.perf_counter() - t0) * 1000)
                await trans.rollback()
        print(
            f"resume_due (500 of {args.due} due moved): median {statistics.median(times):.2f} ms, "
            f"max {max(times):.2f} ms, moved {len(moved)}"
        )
        probes = []
        for _ in range(args.repeat):
            async with db.read() as session:
                t0 = time.perf_counter()
                await queue.next_due(session)
                probes.append((time.perf_counter() - t0) * 1000)
        print(f"next_due: median {statistics.median(probes):.2f} ms")
    finally:
        await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=20)
    ns = parser.parse_args()
    tmp = None
    if ns.database_url is None:
        tmp = Path(tempfile.mkdtemp(prefix="flowyard-waiting-"))
        ns.database_url = f"sqlite+aiosqlite:///{tmp / 'flowyard.db'}"
    try:
        asyncio.run(main(ns))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp)
