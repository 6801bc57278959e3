"""``search`` at scale, trigram index against the plain scan, on SQLite or PostgreSQL.

Loads the catalogue of bench/api.py (100,000 flows, 10 tenants x 10 users) into a fresh
database, then times ``flows.service.list_flows`` (the page and its bounded total: every
statement a ``GET /flows?search=...`` sends) sequentially, as a tenant member and as the
administrator, for a few queries: a word in 4 % of flows, a rarer one, a non-ASCII one, one that matches
nothing, and a 2-character one (always the scan). Each is timed with the index and with the
plain scan: on SQLite by raising the index threshold past the query length, on PostgreSQL by
dropping the GIN indexes inside a transaction that is rolled back. Prints median and p99 (ms)
and the total each query selects (`+`: counted up to its bound, not exact).

    .venv/bin/python bench/search.py [--database-url postgresql+asyncpg://postgres@127.0.0.1/db] \
        [--flows 100000] [--repeat 40]

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
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _seed import create_people, load_flows
from sqlalchemy.ext.asyncio import AsyncSession

from api import flow_body, status_for
from flowyard.api import listing
from flowyard.api.listing import ListQuery
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.flows import service as flows
from flowyard.iam.principal import Principal
from flowyard.models import SEARCH_INDEXES

QUERIES = ["shopify", "pipedrive #12", "übersee", "no such text", "sh"]


async def _time(
    db: Database, session: Any, principal: Principal, query: str, repeat: int
) -> tuple[list[float], str]:
    """``list_flows`` as the API calls it; with ``session`` (PostgreSQL, one whose dropped
    indexes only it sees), the statements of a search other than SQLite's keyed one in it."""
    times = []
    total = ""
    lq = ListQuery(search=query)
    for _ in range(repeat):
        started = time.perf_counter()
        if session is None:
            listed = await flows.list_flows(db, principal, lq)
        else:
            listed = await flows._matched_list(session, principal, lq, None, None, None)
        times.append((time.perf_counter() - started) * 1000)
        total = f"{listed.total}{'' if listed.exact else '+'}"
    return times, total


def _fmt(times: list[float]) -> str:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return f"p50 {statistics.median(times):7.2f} ms, p99 {p99:7.2f} ms"


async def main(args: argparse.Namespace) -> None:
    await migrate.upgrade_async(args.database_url)
    db = Database(args.database_url)
    try:
        started = time.perf_counter()
        people = await create_people(db, args.tenants, args.users)
        await load_flows(db, people, args.flows, flow_body, status_for=status_for)
        pg = not db.is_sqlite
        async with db.engine.connect() as conn:
            await conn.execute(sa.text("ANALYZE"))
            await conn.commit()
        print(f"{args.flows} flows loaded in {time.perf_counter() - started:.0f} s; {db.engine.dialect.name}")
        callers = {
            "member": people.principal(people.users[0][0], people.tenants[0]),
            "admin": Principal(people.admin_id or "0" * 24, "admin", None, frozenset({"all"}), ""),
        }
        for query in QUERIES:
            for who, principal in callers.items():
                indexed, total = await _time(db, None, principal, query, args.repeat)
                async with db.engine.connect() as conn:
                    if pg:
                        trans = await conn.begin()
                        for name in sorted(SEARCH_INDEXES):
                            await conn.execute(sa.text(f"DROP INDEX IF EXISTS {name}"))
                        session_scan = AsyncSession(bind=conn)  # the dropped indexes stay invisible to others
                        scan, _ = await _time(db, session_scan, principal, query, args.repeat)
                        await trans.rollback()
                    else:
                        saved = listing.MIN_INDEXED_SEARCH
                        listing.MIN_INDEXED_SEARCH = 10**9
                        try:
                            scan, _ = await _time(db, None, principal, query, args.repeat)
                        finally:
                            listing.MIN_INDEXED_SEARCH = saved
                print(
                    f"search={query!r:16} {who:6} selects {total:>6}: "
                    f"index {_fmt(indexed)} | scan {_fmt(scan)}"
                )
    finally:
        await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=40)
    ns = parser.parse_args()
    tmp = None
    if ns.database_url is None:
        tmp = Path(tempfile.mkdtemp(prefix="flowyard-search-"))
        ns.database_url = f"sqlite+aiosqlite:///{tmp / 'flowyard.db'}"
    try:
        asyncio.run(main(ns))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp)
