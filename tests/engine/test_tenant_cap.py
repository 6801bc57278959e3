"""The per-tenant cap on executions running at once (SPEC §6, FLOWYARD_MAX_RUNNING_PER_TENANT),
on SQLite and PostgreSQL: a tenant with a backlog never runs more than its cap, counted in the
database across every claimer, while another tenant's execution is claimed at once; queued rows
do not count; 0 turns it off; concurrent claimers (PostgreSQL: SKIP LOCKED, many processes)
cannot together exceed it; held-back work is claimed again as soon as a slot frees."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from flowyard import metrics
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.queue import store as queue
from flowyard.queue.models import Execution
from flowyard.queue.status import ExecutionStatus
from tests.conftest import Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow
from tests.engine.test_fair_claim import seed
from tests.netfixtures import MakeClient, configured

__all__ = ["configured"]

CAP = 3


async def claim(
    db: Database,
    limit: int,
    *,
    cap: int = CAP,
    worker: str = "w1",
    held: set[str] | None = None,
    finished: tuple[str, ...] = (),
) -> list[queue.Claimed]:
    async with db.write(durable=False) as session:
        return await queue.claim(
            session,
            worker_id=worker,
            limit=limit,
            lease_seconds=30,
            cap=cap,
            held_back=held,
            finished=finished,
        )


async def running_of(db: Database, group: str) -> int:
    async with db.read() as session:
        return int(
            await session.scalar(
                sa.select(sa.func.count())
                .select_from(Execution)
                .where(Execution.status == ExecutionStatus.RUNNING, Execution.queue_group == group)
            )
            or 0
        )


async def finish(db: Database, claimed: list[queue.Claimed], worker: str = "w1") -> None:
    async with db.write() as session:
        held = await queue.complete(
            session,
            [
                queue.Outcome(
                    execution_id=c.id,
                    flow_id=c.flow_id,
                    tenant=c.tenant,
                    owner_user=c.owner_user,
                    created_at=c.created_at,
                    status=ExecutionStatus.SUCCEEDED,
                    result=None,
                    error=None,
                    finished_at=c.created_at,
                    steps=[],
                    logs=[],
                )
                for c in claimed
            ],
            worker_id=worker,
        )
    assert held == {c.id for c in claimed}


def test_default_cap_is_half_an_engines_slots() -> None:
    assert Settings(worker_concurrency=64, runners=2, runner_concurrency=32).tenant_running_cap() == 32
    assert Settings(worker_concurrency=16, runners=2, runner_concurrency=32).tenant_running_cap() == 8
    assert Settings(worker_concurrency=1).tenant_running_cap() == 1  # at least one
    assert Settings(max_running_per_tenant=0).tenant_running_cap() == 0  # off
    assert Settings(max_running_per_tenant=5, worker_concurrency=1).tenant_running_cap() == 5
    with pytest.raises(ValueError):
        Settings(max_running_per_tenant=-1)


async def test_a_tenant_runs_at_most_its_cap_while_another_is_claimed(db: Database) -> None:
    a = await seed(db, 5 * CAP, tenant="tenant-a")
    held: set[str] = set()
    first = await claim(db, 64, held=held)
    assert sorted(c.id for c in first) == sorted(a)[:CAP]  # its oldest, up to the cap
    assert held == {"t:tenant-a"}
    held.clear()
    assert await claim(db, 64, held=held) == [] and held == {"t:tenant-a"}
    (b,) = await seed(db, 1, tenant="tenant-b", age=None)
    held.clear()
    assert [c.id for c in await claim(db, 64, held=held)] == [b]  # claimed at once
    assert held == {"t:tenant-a"}
    # One of A's finishes: exactly one more of A's is claimed.
    await finish(db, first[:1])
    again = await claim(db, 64)
    assert [c.id for c in again] == [sorted(a)[CAP]]
    assert await running_of(db, "t:tenant-a") == CAP


async def test_executions_whose_run_ended_hold_no_slot(db: Database) -> None:
    """The claimer's executions whose run has ended, their outcome not yet recorded, are left
    out of the count by id (``finished``): each frees exactly its own slot, before its record
    commits and after it alike, and never another's."""
    a = sorted(await seed(db, 10, tenant="tenant-a"))
    first = await claim(db, 64)
    assert [c.id for c in first] == a[:CAP]
    held: set[str] = set()
    assert await claim(db, 64, held=held) == [] and held == {"t:tenant-a"}
    done = (first[0].id,)
    # Still ``running`` in the database, but its run has ended: its slot is free.
    assert [c.id for c in await claim(db, 64, finished=done)] == [a[CAP]]
    assert await running_of(db, "t:tenant-a") == CAP + 1
    assert await claim(db, 64, finished=done) == []  # the slot went to a[CAP]
    # Its record commits: it stays left out, and frees nothing more.
    await finish(db, first[:1])
    assert await running_of(db, "t:tenant-a") == CAP
    assert await claim(db, 64, finished=done) == []
    # Ids that are not running (a queued one, an unknown one) free nothing; another tenant's
    # work is claimed beside them as ever.
    (b,) = await seed(db, 1, tenant="tenant-b", age=None)
    assert [c.id for c in await claim(db, 64, finished=(a[-1], "0" * 24))] == [b]
    assert await running_of(db, "t:tenant-a") == CAP


async def test_only_running_executions_count(db: Database) -> None:
    """Queued rows, and finished ones, of the tenant take none of its cap."""
    done = await seed(db, 2, tenant="tenant-a")
    await finish(db, await claim(db, 2))
    assert await running_of(db, "t:tenant-a") == 0
    queued = await seed(db, 50, tenant="tenant-a", age=100)
    claimed = await claim(db, 64)
    assert len(claimed) == CAP and {c.id for c in claimed} <= set(queued)
    assert not {c.id for c in claimed} & set(done)


async def test_every_trigger_counts_against_one_cap(db: Database) -> None:
    """The claim is the one way into ``running``, whatever started the execution: a tenant's
    webhooks, cron ticks, event-trigger messages and manual runs share its cap."""
    kinds = ["webhook", "cron", "event", "manual"]
    ids = sorted(await seed(db, 4 * len(kinds), tenant="tenant-a"))  # claim order: oldest id first
    async with db.write() as session:
        for i, eid in enumerate(ids):
            await session.execute(
                sa.update(Execution).where(Execution.id == eid).values(trigger=kinds[i % len(kinds)])
            )
    first = await claim(db, 64)
    assert [c.trigger for c in first] == kinds[:CAP]  # the oldest, whatever their trigger
    await finish(db, first)
    again = await claim(db, 64)
    assert [c.trigger for c in again] == kinds[CAP:] + kinds[: 2 * CAP - len(kinds)]
    assert await running_of(db, "t:tenant-a") == CAP


async def test_a_zero_cap_is_off(db: Database) -> None:
    a = await seed(db, 5 * CAP, tenant="tenant-a")
    held: set[str] = set()
    assert sorted(c.id for c in await claim(db, 64, cap=0, held=held)) == sorted(a)
    assert held == set()


async def test_tenantless_flows_are_capped_per_owner(db: Database) -> None:
    one = await seed(db, 10, tenant=None, owner="user-1")
    two = await seed(db, 10, tenant=None, owner="user-2")
    claimed = [c.id for c in await claim(db, 64)]
    assert sorted(claimed) == sorted(sorted(one)[:CAP] + sorted(two)[:CAP])


async def test_the_cap_also_bounds_the_fallback_to_the_oldest_rows(db: Database) -> None:
    """Rows the fair pick leaves (no group of their own: rows from before queue groups) are
    taken; they never carry a capped tenant past its cap."""
    a = await seed(db, 10, tenant="tenant-a")
    async with db.write() as session:
        await session.execute(sa.update(Execution).where(Execution.id.in_(a[:4])).values(queue_group=None))
    claimed = {c.id for c in await claim(db, 64)}
    assert set(a[:4]) <= claimed and len(claimed) == 4 + CAP


async def test_concurrent_claimers_never_exceed_the_cap_together(db: Database) -> None:
    """Eight claimers at once (PostgreSQL: separate connections, SKIP LOCKED, each taking a
    disjoint set of A's rows): one counts after another, so together they take the cap."""
    await seed(db, 200, tenant="tenant-a")
    for rnd in range(3):
        workers = [f"w{rnd}-{i}" for i in range(8)]
        batches = await asyncio.gather(*(claim(db, 10, worker=w) for w in workers))
        assert sum(len(b) for b in batches) == CAP, [len(b) for b in batches]
        assert await running_of(db, "t:tenant-a") == CAP
        for w, batch in zip(workers, batches, strict=True):
            if batch:
                await finish(db, batch, worker=w)
        assert await running_of(db, "t:tenant-a") == 0


# -- end to end: the worker -----------------------------------------------------------

# A step that holds its execution running for a while: CPU in the runner (not a delay, which
# may stop holding a slot).
BURN = "$count([1..150000])"


def burner(name: str) -> dict[str, Any]:
    return flow_body(
        name=name,
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "calc", "componentId": "jsonata", "fields": {"expression": BURN}},
                {"id": "out", "componentId": "log"},
            ],
            "edges": [{"source": "in", "target": "calc"}, {"source": "calc", "target": "out"}],
        },
    )


@contextlib.asynccontextmanager
async def sampled(db: Database, group: str) -> AsyncIterator[list[int]]:
    """The group's running count, read from the database again and again while inside."""
    seen: list[int] = []

    async def sample() -> None:
        while True:
            seen.append(await running_of(db, group))
            await asyncio.sleep(0.005)

    task = asyncio.create_task(sample())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    n = best = 0
    for _, d in events:
        n += d
        best = max(best, n)
    return best


async def rows_of(db: Database, flow_id: str) -> list[Any]:
    async with db.read() as session:
        return list(
            (
                await session.execute(
                    sa.select(Execution.status, Execution.started_at, Execution.finished_at).where(
                        Execution.flow_id == flow_id
                    )
                )
            ).all()
        )


@pytest.mark.parametrize("engines", [1, 2])
async def test_a_tenants_backlog_never_holds_more_than_its_cap(
    configured: MakeClient, factory: Factory, db: Database, engines: int
) -> None:
    """Tenant A's 5 x cap webhooks never run more than the cap at once (sampled from the
    database, and from the recorded start and finish times), with one engine or two on the
    same database, while tenant B's execution is claimed at once and finishes before A's
    backlog drains. The poll interval is 30 s: held-back work is claimed again when a slot
    frees, not at the next poll."""
    settings = {"worker_concurrency": 16, "max_running_per_tenant": CAP, "poll_interval": 30}
    c = await configured(**settings)
    for _ in range(engines - 1):
        await configured(**settings)
    ta, tb = await factory.tenant(), await factory.tenant()
    alice, bob = await factory.user(tenant=ta), await factory.user(tenant=tb)
    fa = await active_flow(c, alice, burner("burner"))
    fb = await active_flow(c, bob, flow_body(name="quick"))
    before = metrics._m().held_back._value.get()
    async with sampled(db, f"t:{ta}") as seen:
        posted = await asyncio.gather(*(c.post(f"/webhooks/{fa}", json={"i": i}) for i in range(5 * CAP)))
        assert {r.status_code for r in posted} == {202}
        r = await c.post(f"/webhooks/{fb}", params={"wait": 20}, json={"hello": "b"})
        assert r.status_code == 200, r.text

        async def drained() -> bool:
            rows = await rows_of(db, fa)
            return len(rows) == 5 * CAP and {row.status for row in rows} == {"succeeded"}

        await wait_until(drained, within=25)
    # The cap was reached, and never passed by what ran: the recorded runs never overlap more
    # than CAP deep. The database may count up to CAP more as running for a moment: runs that
    # ended, whose outcomes are not yet recorded, hold no slot (queue.claim's ``finished``).
    assert CAP <= max(seen) <= 2 * CAP, seen
    a_rows = await rows_of(db, fa)
    assert max_overlap([(row.started_at, row.finished_at) for row in a_rows]) <= CAP
    (b_row,) = await rows_of(db, fb)
    assert b_row.status == "succeeded"
    assert b_row.finished_at < max(row.finished_at for row in a_rows)
    assert metrics._m().held_back._value.get() > before
