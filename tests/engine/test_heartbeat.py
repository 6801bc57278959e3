"""Process heartbeats on SQLite and PostgreSQL: a process whose heartbeat stopped loses
its executions and its event-trigger leases at once (counted as a re-run, the max re-run
rule applies), a live one keeps them, and a process declared dead records no outcome for
what it held."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import timedelta

import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.queue import heartbeat
from flowyard.queue import store as queue
from flowyard.queue.heartbeat import ProcessHeartbeat
from flowyard.queue.models import Execution
from flowyard.queue.trigger_lease import TriggerLease
from flowyard.triggers import leases as triggers
from tests.engine.test_fair_claim import claim, seed


async def _beat(db: Database, pid: str, *, age: float = 0.0) -> None:
    async with db.write() as session:
        await heartbeat.beat(session, pid)
    if age:
        async with db.write() as session:
            await session.execute(
                sa.update(ProcessHeartbeat)
                .where(ProcessHeartbeat.id == pid)
                .values(beat_at=utcnow() - timedelta(seconds=age))
            )


async def _sweep(db: Database, me: str, max_attempts: int = 5) -> tuple[list[str], int, list[str]]:
    async with db.write() as session:
        dead = await heartbeat.take_dead(session, me=me, after_seconds=3)
        requeued, failed = await queue.reap(session, max_attempts=max_attempts, owners=dead)
    return dead, requeued, [e.id for e in failed]


def _outcome(c: queue.Claimed) -> queue.Outcome:
    return queue.Outcome(
        execution_id=c.id,
        flow_id=c.flow_id,
        tenant=c.tenant,
        owner_user=c.owner_user,
        created_at=c.created_at,
        status="succeeded",
        result={"ok": True},
        error=None,
        finished_at=utcnow(),
        steps=[],
        logs=[],
    )


async def _status(db: Database) -> dict[str, tuple[str, str | None, int]]:
    async with db.read() as session:
        rows = await session.execute(
            sa.select(Execution.id, Execution.status, Execution.lease_owner, Execution.attempts)
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}


async def test_a_stale_heartbeat_loses_its_executions_and_records_nothing(db: Database) -> None:
    ids = await seed(db, 4, tenant="t")
    await _beat(db, "dead-one", age=10)
    await _beat(db, "alive-one")
    held_dead = await claim(db, 2, worker="dead-one")
    held_alive = await claim(db, 2, worker="alive-one")
    await _beat(db, "sweeper")

    dead, requeued, failed = await _sweep(db, "sweeper")
    assert dead == ["dead-one"] and requeued == 2 and failed == []
    state = await _status(db)
    assert {state[c.id] for c in held_dead} == {("queued", None, 1)}
    assert {state[c.id][:2] for c in held_alive} == {("running", "alive-one")}
    async with db.read() as session:
        left = set((await session.scalars(sa.select(ProcessHeartbeat.id))).all())
    assert left == {"alive-one", "sweeper"}

    # The process was only slow: its outcomes arrive now and are dropped, for whoever
    # re-runs those executions records them once.
    async with db.write() as session:
        held = await queue.complete(session, [_outcome(c) for c in held_dead], worker_id="dead-one")
    assert held == set()
    assert {(await _status(db))[c.id][0] for c in held_dead} == {"queued"}
    # It learns it was declared dead at its next beat.
    async with db.write() as session:
        assert await heartbeat.beat(session, "dead-one") is False
    assert sorted(c.id for c in held_dead + held_alive) == sorted(ids)


async def test_a_fresh_heartbeat_and_ones_own_are_never_taken(db: Database) -> None:
    await seed(db, 2, tenant="t")
    await _beat(db, "me", age=10)  # even stale, a process never declares itself dead
    await _beat(db, "other", age=1)
    await claim(db, 1, worker="me")
    await claim(db, 1, worker="other")
    assert await _sweep(db, "me") == ([], 0, [])
    assert {s for s, _o, _a in (await _status(db)).values()} == {"running"}


async def test_release_by_heartbeat_respects_the_max_rerun_rule(db: Database) -> None:
    (eid,) = await seed(db, 1, tenant="t")
    async with db.write() as session:
        await session.execute(sa.update(Execution).where(Execution.id == eid).values(attempts=2))
    await _beat(db, "crashy", age=10)
    await claim(db, 1, worker="crashy")  # attempts 3
    dead, requeued, failed = await _sweep(db, "sweeper", max_attempts=3)
    assert dead == ["crashy"] and requeued == 0 and failed == [eid]
    assert (await _status(db))[eid] == ("failed", None, 3)


async def test_a_gone_process_of_this_host_is_dead_at_once_on_sqlite(db: Database) -> None:
    """A restarted ``serve`` takes back its previous instance's work without waiting."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()  # a pid that existed and is gone now
    await seed(db, 1, tenant="t")
    async with db.write() as session:
        session.add(
            ProcessHeartbeat(
                id="previous", host=heartbeat.host_name(), pid=proc.pid, started_at=utcnow(), beat_at=utcnow()
            )
        )
    await claim(db, 1, worker="previous")
    dead, requeued, _failed = await _sweep(db, "restarted")
    if db.is_sqlite:
        assert (dead, requeued) == (["previous"], 1)
    else:  # processes on other machines share the hostname space: only the clock decides
        assert (dead, requeued) == ([], 0)


async def test_a_killed_unreaped_process_of_this_host_is_dead_at_once_on_sqlite(db: Database) -> None:
    """A zombie (SIGKILLed, its parent has not waited for it yet) still answers kill(pid, 0)."""
    # Popen, not asyncio's: its child watcher would reap the process at once.
    proc = subprocess.Popen(["sleep", "60"])  # noqa: ASYNC220
    try:
        async with db.write() as session:
            session.add(
                ProcessHeartbeat(
                    id="zombie",
                    host=heartbeat.host_name(),
                    pid=proc.pid,
                    started_at=utcnow(),
                    beat_at=utcnow(),
                )
            )
        assert await _sweep(db, "sweeper") == ([], 0, []), "alive: kept"
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # noqa: ASYNC222 - dead, left unreaped
        dead, _requeued, _failed = await _sweep(db, "sweeper")
        assert dead == (["zombie"] if db.is_sqlite else [])
    finally:
        proc.kill()
        proc.wait()


async def test_a_dead_process_frees_its_trigger_leases_in_the_take_back(db: Database) -> None:
    """The holder of a trigger lease is its engine's heartbeat id: the transaction that deletes a
    stale heartbeat frees that process's leases (not a live one's), and one taker takes each."""
    await _beat(db, "dead-one", age=10)
    await _beat(db, "alive-one")
    now = utcnow()
    async with db.write() as session:
        for fid in ("f-dead-1", "f-dead-2", "f-alive"):
            await triggers.ensure(session, fid, 1)
        for fid, holder in (("f-dead-1", "dead-one"), ("f-dead-2", "dead-one"), ("f-alive", "alive-one")):
            assert await triggers.take(session, fid, holder, now, 30)
            await triggers.mark(session, fid, holder, subscribed_at=now, problem=None)
    async with db.write() as session:
        # Unexpired, so before the heartbeat decides nobody else may take them.
        assert not await triggers.take(session, "f-dead-1", "sweeper", now, 30)
    async with db.write() as session:
        dead = await heartbeat.take_dead(session, me="sweeper", after_seconds=3)
        freed = await heartbeat.free_trigger_leases(session, dead)
    assert dead == ["dead-one"] and freed == ["f-dead-1", "f-dead-2"]
    async with db.read() as session:
        rows = {
            r[0]: r[1:]
            for r in await session.execute(
                sa.select(TriggerLease.flow_id, TriggerLease.holder, TriggerLease.subscribed_at)
            )
        }
    assert rows["f-dead-1"] == (None, None) and rows["f-dead-2"] == (None, None)
    assert rows["f-alive"][0] == "alive-one" and rows["f-alive"][1] is not None
    async with db.write() as session:
        assert await triggers.take(session, "f-dead-1", "sweeper", now, 30)
    async with db.write() as session:
        assert not await triggers.take(session, "f-dead-1", "alive-one", now, 30), "one taker"
        assert await heartbeat.free_trigger_leases(session, []) == []


async def test_a_reused_pid_of_this_host_is_dead_at_once_on_sqlite(db: Database) -> None:
    """A restarted container hands its new processes the same small pids: a live process that
    started after the heartbeat row was written is not the row's process."""
    proc = subprocess.Popen(["sleep", "60"])  # noqa: ASYNC220 - started after the row below
    try:
        async with db.write() as session:
            session.add(
                ProcessHeartbeat(
                    id="before-restart",
                    host=heartbeat.host_name(),
                    pid=proc.pid,
                    started_at=utcnow() - timedelta(seconds=30),
                    beat_at=utcnow(),
                )
            )
        dead, _requeued, _failed = await _sweep(db, "sweeper")
        assert dead == (["before-restart"] if db.is_sqlite else [])
    finally:
        proc.kill()
        proc.wait()
