"""Counts read from the weekly and monthly rollups equal the counts summed from the daily
counters, for random executions over random days and random frames, in every grouping and
for every kind of caller (SPEC §8; issue 8), on SQLite and PostgreSQL.

Executions are written by the engine's own queue (``enqueue`` counts them, ``complete``
counts their steps); the answer is the service's, the oracle sums the daily rows in the
caller's scope (``tenant_data_clause``, the one scoping rule)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.executions import service
from flowyard.iam.principal import Principal
from flowyard.iam.visibility import tenant_data_clause
from flowyard.queue import periods, pruner
from flowyard.queue import store as queue
from flowyard.queue.models import ComponentDayCount, Execution, FlowDayCount, FlowPeriodCount
from tests.conftest import truncate

# (flow id, tenant, user owner, components run by each execution)
FLOWS = [
    ("f" * 23 + "1", "t1", "u1", ("webhook", "jsonata")),
    ("f" * 23 + "2", "t1", "u2", ("webhook", "log")),
    ("f" * 23 + "3", "t2", "u3", ("webhook", "jsonata", "http")),
    ("f" * 23 + "4", None, "u4", ("log",)),
    ("f" * 23 + "5", None, "u5", ("webhook", "log")),
]
CALLERS = {
    "admin": Principal("a" * 24, "admin", None, frozenset({"all"}), ""),
    "tenant t1": Principal("u1", "u1", "t1", frozenset(), ""),
    "tenant t2": Principal("u3", "u3", "t2", frozenset(), ""),
    "tenantless u4": Principal("u4", "u4", None, frozenset(), ""),
    "outsider": Principal("u9", "u9", "t9", frozenset(), ""),
}
SPAN = 150  # days of history

executions = st.lists(
    st.tuples(st.integers(0, len(FLOWS) - 1), st.integers(0, SPAN - 1), st.integers(1, 3)),
    min_size=1,
    max_size=60,
)
frames = st.lists(st.tuples(st.integers(-10, SPAN + 10), st.integers(0, SPAN + 20)), min_size=1, max_size=4)


async def _record(db: Database, base: date, batches: list[list[tuple[int, int, int]]]) -> None:
    n = 0
    for batch in batches:
        items, outcomes = [], []
        for flow, offset, runs in batch:
            fid, tenant, user, components = FLOWS[flow]
            n += 1
            eid = f"{n:024x}"
            created = datetime.combine(base + timedelta(days=offset), time(12), UTC)
            items.append(
                queue.NewExecution(eid, fid, 1, f"flow {flow}", tenant, user, "manual", None, created)
            )
            steps = [
                queue.StepRecord(
                    f"n{i}", cid, None, "succeeded", runs, runs, runs, 1.0, created, created, None, None, i
                )
                for i, cid in enumerate(components)
            ]
            outcomes.append(
                queue.Outcome(eid, fid, tenant, user, created, "succeeded", None, None, created, steps)
            )
        async with db.write() as session:
            await queue.enqueue(session, items)
        async with db.write() as session:
            await session.execute(
                sa.update(Execution)
                .where(Execution.id.in_([o.execution_id for o in outcomes]))
                .values(status="running", lease_owner="w")
            )
            await queue.complete(session, outcomes, worker_id="w")


async def _from_daily_rows(
    db: Database, principal: Principal, start: date, end: date, groupby: str
) -> tuple[dict[str, Any], int]:
    """What summing the daily counters in the caller's scope answers."""
    async with db.read() as session:
        f: Any = FlowDayCount
        flow_rows = (
            await session.execute(
                sa.select(f.flow_id, f.user_id, f.executions).where(
                    f.day >= start, f.day <= end, tenant_data_clause(principal, f.tenant, f.user_id)
                )
            )
        ).all()
        c: Any = ComponentDayCount
        comp_rows = (
            await session.execute(
                sa.select(c.component_id, c.flow_id, c.steps).where(
                    c.day >= start, c.day <= end, tenant_data_clause(principal, c.tenant, c.user_id)
                )
            )
        ).all()
    total = sum(n for _, _, n in flow_rows)
    sums: dict[str, int] = defaultdict(int)
    flows: dict[str, set[str]] = defaultdict(set)
    if groupby == "flow":
        for fid, _, n in flow_rows:
            sums[fid] += n
    elif groupby == "user":
        for fid, user, n in flow_rows:
            sums[user] += n
            flows[user].add(fid)
    else:
        for cid, fid, n in comp_rows:
            sums[cid] += n
            flows[cid].add(fid)
    return {k: (sums[k], sorted(flows[k])) for k in sums}, total


async def _check(db_url: str, base: date, batches: list[list[tuple[int, int, int]]], frames: Any) -> None:
    db = Database(db_url)
    try:
        await truncate(db)
        await _record(db, base, batches)
        for lo, length in frames:
            start = base + timedelta(days=lo)
            end = start + timedelta(days=length)
            for who, principal in CALLERS.items():
                for groupby in service.GROUPINGS:
                    async with db.read() as session:
                        data, total = await service.counts(
                            session, principal, start=start, end=end, groupby=groupby
                        )
                    got = {r["_id"]: (r["executions"], r.get("allFlows", [])) for r in data}
                    expected, expected_total = await _from_daily_rows(db, principal, start, end, groupby)
                    if groupby == "flow":
                        expected = {k: (n, []) for k, (n, _) in expected.items()}
                    assert (got, total) == (expected, expected_total), (who, groupby, start, end)
    finally:
        await db.dispose()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=st.dates(date(2023, 1, 1), date(2027, 12, 31)),
    work=st.lists(executions, min_size=1, max_size=3),
    frames=frames,
)
def test_counts_from_rollups_equal_counts_from_daily_rows(
    db_url: str, base: date, work: list[list[tuple[int, int, int]]], frames: Any
) -> None:
    asyncio.run(_check(db_url, base, work, frames))


def test_a_long_frame_reads_months_and_weeks(db_url: str) -> None:
    """A fixed case the random ones may miss: executions on every day of 120 days, frames
    that start and end mid-week and mid-month, across a year end."""
    base = date(2025, 10, 1)
    work = [[(d % len(FLOWS), d, 1 + d % 3) for d in range(0, 120, 2)], [(3, d, 1) for d in range(1, 120, 2)]]
    asyncio.run(_check(db_url, base, work, [(3, 100), (0, 119), (13, 40), (30, 31), (-5, 200)]))


def test_a_frame_of_many_periods_and_a_frame_of_one_day(db_url: str) -> None:
    """Beyond MAX_SINGLE_PIECES single periods the component counts read ranges of them
    (six years here); a frame of one period reads it alone. Same answers as the daily rows."""
    base = date(2020, 1, 1)
    work = [[(flow, offset, 1 + flow % 2) for flow in range(len(FLOWS)) for offset in range(0, 2200, 97)]]
    frames = [(-3, 2200), (97, 0), (98, 0), (0, 6)]
    assert (
        periods.cover(base - timedelta(days=3), base + timedelta(days=2197)).count()
        > service.MAX_SINGLE_PIECES
    )
    asyncio.run(_check(db_url, base, work, frames))


async def test_pruning_keeps_the_rollups(db: Database) -> None:
    """Counts over whole months and weeks, read from the rollups, survive pruning of the
    executions they count (as the daily counters do)."""
    base = date(2026, 6, 1)
    await _record(db, base, [[(flow, day, 2) for flow in range(len(FLOWS)) for day in (0, 9, 31, 45, 60)]])
    admin = CALLERS["admin"]

    async def answers() -> list[Any]:
        out = []
        async with db.read() as session:
            for groupby in service.GROUPINGS:
                out.append(
                    await service.counts(
                        session, admin, start=base, end=base + timedelta(days=90), groupby=groupby
                    )
                )
        return out

    before = await answers()
    assert before[0][1] == 5 * len(FLOWS)
    counts = await pruner.prune(db, retention=timedelta(days=1), batch=7, now=utcnow())
    assert counts["executions"] == 5 * len(FLOWS)
    async with db.read() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Execution)) == 0
        assert await session.scalar(sa.select(sa.func.count()).select_from(FlowPeriodCount)) > 0
    assert await answers() == before
