"""A runner death is charged to the execution that caused it (issue 17), on SQLite and
PostgreSQL, with the real engine and real runner processes: tenant A's anonymous webhooks
start memory bombs and CPU burners while tenant B's innocent executions (webhook, a 2 s
delay that keeps them aboard a runner, log) are in flight. Before, B's executions shared
runners with A's bombs and failed with "its runner process died 3 times while running it";
now a runner holds one tenant at a time, the suspects of a death run again alone, and only
A's executions fail, each with its limit named."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.queue.models import Execution
from flowyard.runtime.pool import RunnerPool
from tests.conftest import Factory, flow_body, wait_until
from tests.engine.test_containment import BOMB, RUNAWAY, _jsonata_flow
from tests.engine.test_engine_e2e import active_flow
from tests.engine.test_pool import _claimed, _delay, _jsonata, _spec, pool
from tests.netfixtures import MakeClient, configured

__all__ = ["configured", "pool"]

pytestmark = [pytest.mark.slow]

LIMITS: dict[str, Any] = {
    "runners": 2,
    "runner_surge": 1,
    "execution_cpu_seconds": 1.5,
    "runner_memory_mb": 256,
    "step_timeout": 30,
    "worker_concurrency": 32,
}


def _victim_flow() -> dict[str, Any]:
    return flow_body(
        name="victim",
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "wait", "componentId": "delay", "fields": {"seconds": 2}},
                {"id": "out", "componentId": "log"},
            ],
            "edges": [{"source": "in", "target": "wait"}, {"source": "wait", "target": "out"}],
        },
    )


async def _outcomes(db: Database, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    async with db.read() as session:
        rows = (
            await session.execute(
                sa.select(Execution.id, Execution.status, Execution.error).where(Execution.id.in_(ids))
            )
        ).all()
    return {r[0]: (r[1], r[2]) for r in rows if r[1] in ("succeeded", "failed", "cancelled")}


async def test_a_tenants_bombs_fail_only_its_own_executions(
    configured: MakeClient, factory: Factory, db: Database
) -> None:
    c = await configured(**LIMITS)
    ta, tb = await factory.tenant(), await factory.tenant()
    alice, bob = await factory.user(tenant=ta), await factory.user(tenant=tb)
    bomb = await active_flow(c, alice, _jsonata_flow("bomb", BOMB))
    burner = await active_flow(c, alice, _jsonata_flow("burner", RUNAWAY))
    victim = await active_flow(c, bob, _victim_flow())

    async def hook(anonymous: httpx.AsyncClient, fid: str, i: int) -> str:
        r = await anonymous.post(f"/webhooks/{fid}", json={"i": i})
        assert r.status_code == 202, r.text
        return str(r.json()["data"]["executionId"])

    anonymous = c  # webhooks need no token: the same client, no credentials sent
    innocent = [await hook(anonymous, victim, i) for i in range(3)]
    bombs = list(await asyncio.gather(*(hook(anonymous, bomb, i) for i in range(3))))
    burners = list(await asyncio.gather(*(hook(anonymous, burner, i) for i in range(1))))
    innocent += [await hook(anonymous, victim, i) for i in range(3, 6)]
    everything = [*innocent, *bombs, *burners]

    async def all_done() -> dict[str, tuple[str, str | None]] | None:
        done = await _outcomes(db, everything)
        return done if len(done) == len(everything) else None

    done: dict[str, tuple[str, str | None]] = await wait_until(all_done, within=55)
    assert {done[e] for e in innocent} == {("succeeded", None)}, [done[e] for e in innocent]
    assert {done[e] for e in bombs} == {("failed", "step calc exceeded the 256 MiB memory limit")}
    assert {done[e] for e in burners} == {("failed", "step calc exceeded the 1.5 s CPU limit")}
    async with db.read() as session:
        attempts = await session.scalars(sa.select(Execution.attempts).where(Execution.id.in_(innocent)))
        assert set(attempts) == {1}, "re-run inside the pool, never handed back to the queue"


# -- the pool alone, with real runner processes -----------------------------------------


def _running(pool: RunnerPool) -> list[tuple[int, bool]]:
    return sorted((r["running"], r["surge"]) for r in pool.stats()["runners"] if r["ready"])


async def _until(pool: RunnerPool, want: list[tuple[int, bool]]) -> None:
    async def seen() -> bool:
        return _running(pool) == want

    try:
        await wait_until(seen, within=30)
    except AssertionError:
        raise AssertionError(f"runners (running, surge) {_running(pool)}, not {want}") from None


@pytest.mark.parametrize("pool", [{"runner_surge": 1}], indirect=True)
async def test_another_tenant_gets_a_surge_runner_not_a_seat_beside(
    pool: RunnerPool, registry: Registry
) -> None:
    """One runner (FLOWYARD_RUNNERS=1) holding tenant t-1's executions: t-2's goes to a surge
    runner of its own, never into the runner t-1's are aboard."""
    slow = _spec(registry, _delay(8))
    await _until(pool, [(0, False)])  # started
    mine = [pool.run(slow, _claimed(slow, {"n": i})) for i in range(2)]
    theirs = dataclasses.replace(_claimed(slow, {"n": 9}), tenant="t-2")
    runs = asyncio.gather(*mine, pool.run(slow, theirs))
    await _until(pool, [(1, True), (2, False)])
    assert [o.status for o in await runs] == ["succeeded"] * 3


@pytest.mark.parametrize("pool", [{"runner_surge": 0}], indirect=True)
async def test_without_surge_another_tenant_waits_for_the_runner_to_empty(
    pool: RunnerPool, registry: Registry
) -> None:
    slow = _spec(registry, _delay(1.5))
    await _until(pool, [(0, False)])
    first = asyncio.ensure_future(pool.run(slow, _claimed(slow)))
    await _until(pool, [(1, False)])
    theirs = dataclasses.replace(_claimed(slow, {"n": 9}), tenant="t-2")
    second = asyncio.ensure_future(pool.run(slow, theirs))
    mine_later = asyncio.ensure_future(pool.run(slow, _claimed(slow, {"n": 2})))
    await wait_until(lambda: _async(theirs.id in pool.waiting_ids()))
    assert _running(pool) == [(1, False)], "t-2 is not placed beside t-1, and the runner drains"
    assert [o.status for o in await asyncio.gather(first, second, mine_later)] == ["succeeded"] * 3


async def _async(value: bool) -> bool:
    return value


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    "pool",
    [{"runners": 2, "runners_warm": 1, "runner_surge": 1, "runner_surge_idle_seconds": 1.0}],
    indirect=True,
)
async def test_a_second_runner_starts_for_another_tenant_and_stops_when_idle(
    pool: RunnerPool, registry: Registry
) -> None:
    """FLOWYARD_RUNNERS=2, one warm: the second runner (a base one, not a surge one) starts only
    when another tenant needs a runner, and stops, its process gone, once idle; the warm one stays."""
    slow = _spec(registry, _delay(1.5))
    await _until(pool, [(0, False)])
    await asyncio.sleep(1.5)
    assert _running(pool) == [(0, False)], "one tenant's pool starts one runner"
    first = asyncio.ensure_future(pool.run(slow, _claimed(slow)))
    await _until(pool, [(1, False)])
    theirs = dataclasses.replace(_claimed(slow, {"n": 9}), tenant="t-2")
    second = asyncio.ensure_future(pool.run(slow, theirs))
    await _until(pool, [(1, False), (1, False)])
    pids = [int(r["pid"]) for r in pool.stats()["runners"] if r["ready"]]
    assert [o.status for o in await asyncio.gather(first, second)] == ["succeeded"] * 2
    await _until(pool, [(0, False)])
    gone = [pid for pid in pids if not _alive(pid)]
    assert len(gone) == 1, "the idle on-demand runner's process is stopped"
    again = await pool.run(slow, dataclasses.replace(_claimed(slow, {"n": 10}), tenant="t-3"))
    assert again.status == "succeeded"


@pytest.mark.parametrize("pool", [{"runner_memory_mb": 128}], indirect=True)
async def test_suspects_of_a_memory_death_run_again_alone_and_only_the_bomb_fails(
    pool: RunnerPool, registry: Registry
) -> None:
    """A memory death with company has no certain culprit: every execution aboard runs again
    alone; the bomb kills its runner again and fails, the others succeed, none of them blamed."""
    slow = _spec(registry, _delay(1.5), _jsonata("n + 1"))
    bomb = _spec(registry, _jsonata(BOMB))
    await _until(pool, [(0, False)])
    runs = [pool.run(slow, _claimed(slow, {"n": i})) for i in range(3)]
    gathered = asyncio.gather(*runs)
    await _until(pool, [(3, False)])
    bad = await pool.run(bomb, _claimed(bomb))
    assert bad.status == "failed" and bad.error == "step calc exceeded the 128 MiB memory limit"
    good = await gathered
    assert [(o.status, o.result) for o in good] == [("succeeded", {"data": i + 1}) for i in range(3)]
    assert pool.isolated == 4 and pool.limit_kills == 2
