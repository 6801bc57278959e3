"""The two state machines, on SQLite and PostgreSQL: every (from, to) pair of states is tried
on a real row. An allowed move moves a row in ``from`` and leaves a row in any other state
alone (the conditional UPDATE); a move outside the table is refused before the row is touched.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.flows import status as fl
from flowyard.flows.models import Flow
from flowyard.ids import new_id
from flowyard.queue import status as ex
from flowyard.queue.models import Execution

FLOW_PAIRS = list(itertools.product(fl.FlowStatus, repeat=2))
EXECUTION_PAIRS = list(itertools.product(ex.ExecutionStatus, repeat=2))

# The moves SPEC §3 (flows) and the queue (executions) need, written out here once more so
# that a change to either table has to be made on purpose in both places.
FLOW_ALLOWED = {
    ("inactive", "starting"),
    ("active", "stopping"),
    ("starting", "active"),
    ("starting", "inactive"),
    ("stopping", "inactive"),
}
EXECUTION_ALLOWED = {
    ("queued", "running"),
    ("running", "queued"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("queued", "cancelled"),
    ("queued", "failed"),
    ("running", "waiting"),
    ("waiting", "queued"),
    ("waiting", "cancelled"),
    ("waiting", "failed"),
}


def test_the_tables_are_the_expected_ones() -> None:
    assert {(a.value, b.value) for a, b in fl.MOVES} == FLOW_ALLOWED
    assert {(a.value, b.value) for a, b in ex.MOVES} == EXECUTION_ALLOWED
    # The stored strings stay what the API and the database always held.
    assert [s.value for s in fl.FlowStatus] == ["inactive", "starting", "active", "stopping"]
    assert list(ex.EXECUTION_STATUSES) == ["queued", "running", "waiting", "succeeded", "failed", "cancelled"]
    # Finished executions never move again.
    assert not [pair for pair in ex.MOVES if pair[0] in ex.FINISHED]


async def _flow(db: Database, status: str) -> str:
    fid = new_id()
    then = utcnow() - timedelta(minutes=5)
    async with db.write() as session:
        await session.execute(
            sa.insert(Flow).values(
                id=fid,
                name="sm",
                name_lc="sm",
                type="ordinary",
                graph={"nodes": [], "edges": []},
                owners=[],
                status=status,
                status_message="before",
                status_changed_at=then,
                next_run_at=then,
                created_at=then,
                updated_at=then,
            )
        )
    return fid


async def _flow_row(db: Database, fid: str) -> sa.Row[tuple[str, str | None, object]]:
    async with db.read() as session:
        return (
            await session.execute(
                sa.select(Flow.status, Flow.status_message, Flow.status_changed_at).where(Flow.id == fid)
            )
        ).one()


@pytest.mark.parametrize(("frm", "to"), FLOW_PAIRS, ids=[f"{a}->{b}" for a, b in FLOW_PAIRS])
async def test_flow_move(db: Database, frm: fl.FlowStatus, to: fl.FlowStatus) -> None:
    at = utcnow()
    here = await _flow(db, frm)
    elsewhere = {s: await _flow(db, s) for s in fl.FlowStatus if s != frm}
    before = {fid: await _flow_row(db, fid) for fid in [here, *elsewhere.values()]}
    if (frm.value, to.value) in FLOW_ALLOWED:
        async with db.write() as session:
            assert await fl.move(session, here, frm, to, at=at, message="moved")
            for fid in elsewhere.values():  # a row in another state: the UPDATE matches nothing
                assert not await fl.move(session, fid, frm, to, at=at, message="moved")
        status, message, changed = await _flow_row(db, here)
        assert (status, message, changed) == (to.value, "moved", at)
    else:
        for fid in [here, *elsewhere.values()]:
            async with db.write() as session:
                with pytest.raises(fl.IllegalMove):
                    await fl.move(session, fid, frm, to, at=at, message="moved")
        assert await _flow_row(db, here) == before[here]
    for fid in elsewhere.values():
        assert await _flow_row(db, fid) == before[fid]


async def test_flow_move_keeps_or_sets_next_run(db: Database) -> None:
    fid = await _flow(db, "starting")
    at = utcnow()
    async with db.write() as session:
        assert await fl.move(session, fid, fl.FlowStatus.STARTING, fl.FlowStatus.ACTIVE, at=at)
        assert await fl.move(session, fid, fl.FlowStatus.ACTIVE, fl.FlowStatus.STOPPING, at=at)
    async with db.read() as session:
        kept = await session.scalar(sa.select(Flow.next_run_at).where(Flow.id == fid))
    assert kept is not None  # not given: left as it was
    async with db.write() as session:
        assert await fl.move(
            session, fid, fl.FlowStatus.STOPPING, fl.FlowStatus.INACTIVE, at=at, next_run_at=None
        )
    async with db.read() as session:
        assert await session.scalar(sa.select(Flow.next_run_at).where(Flow.id == fid)) is None


async def _execution(db: Database, status: str) -> str:
    eid = new_id()
    async with db.write() as session:
        await session.execute(
            sa.insert(Execution).values(
                id=eid,
                flow_id=new_id(),
                flow_version=1,
                trigger="manual",
                status=status,
                created_at=utcnow(),
                attempts=1,
                lease_owner="w1",
            )
        )
    return eid


async def _execution_status(db: Database, eid: str) -> str:
    async with db.read() as session:
        return str(await session.scalar(sa.select(Execution.status).where(Execution.id == eid)))


async def _move(db: Database, eid: str, stmt: sa.Update) -> int:
    async with db.write() as session:
        result = await session.execute(stmt.where(Execution.id == eid).values(lease_owner=None))
        return int(result.rowcount)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("frm", "to"), EXECUTION_PAIRS, ids=[f"{a}->{b}" for a, b in EXECUTION_PAIRS])
async def test_execution_move(db: Database, frm: ex.ExecutionStatus, to: ex.ExecutionStatus) -> None:
    here = await _execution(db, frm)
    elsewhere = {s: await _execution(db, s) for s in ex.ExecutionStatus if s != frm}
    if (frm.value, to.value) in EXECUTION_ALLOWED:
        assert ex.check(frm, to) == to
        assert await _move(db, here, ex.update(frm, to)) == 1
        assert await _execution_status(db, here) == to.value
        for fid in elsewhere.values():
            assert await _move(db, fid, ex.update(frm, to)) == 0
    else:
        with pytest.raises(ex.IllegalMove):
            ex.check(frm, to)
        with pytest.raises(ex.IllegalMove):
            ex.update(frm, to)
        with pytest.raises(ex.IllegalMove):  # one bad source among several refuses the statement
            ex.update([s for s in ex.ExecutionStatus if s != to], to)
        assert await _execution_status(db, here) == frm.value
    for s, fid in elsewhere.items():
        assert await _execution_status(db, fid) == s.value


async def test_execution_outcomes_bound_per_row(db: Database) -> None:
    """The executemany form (the queue records a batch of outcomes): the target is bound per
    row, each row's value checked where it is bound; rows no longer running are left alone."""
    running = [await _execution(db, "running") for _ in range(3)]
    cancelled = await _execution(db, "cancelled")
    table = Execution.__table__
    stmt = ex.update(ex.ExecutionStatus.RUNNING, sa.bindparam("st")).where(table.c.id == sa.bindparam("eid"))
    outcomes = [
        (running[0], "succeeded"),
        (running[1], "failed"),
        (running[2], "cancelled"),
        (cancelled, "failed"),
    ]
    async with db.write() as session:
        await session.execute(
            stmt,
            [{"eid": eid, "st": ex.check(ex.ExecutionStatus.RUNNING, st)} for eid, st in outcomes],
        )
    assert [await _execution_status(db, eid) for eid in running] == ["succeeded", "failed", "cancelled"]
    assert await _execution_status(db, cancelled) == "cancelled"
    for bad in ("running", "lost", ""):
        with pytest.raises(ex.IllegalMove):
            ex.check(ex.ExecutionStatus.RUNNING, bad)
