"""A runner death is charged to the execution that caused it (issue 17), on SQLite and
PostgreSQL, with the real engine and real runner processes: tenant A's anonymous webhooks
start memory bombs and CPU burners while tenant B's innocent executions (webhook, a 2 s
delay that keeps them aboard a runner, log) are in flight. Before, B's executions shared
runners with A's bombs and failed with "its runner process died 3 times while running it";
now a runner holds one tenant at a time, the suspects of a death run again alone, and only
A's executions fail, each with its limit named."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.db.session import Database
from flowyard.queue.models import Execution
from tests.conftest import Factory, flow_body, wait_until
from tests.engine.test_containment import BOMB, RUNAWAY, _jsonata_flow
from tests.engine.test_engine_e2e import active_flow
from tests.netfixtures import MakeClient, configured

__all__ = ["configured"]

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
