"""Waiting holds nothing (SPEC §11): one tenant's executions parked in a long delay take no
runner, worker slot or lease; another tenant's executions run at once. SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import sqlalchemy as sa
from fastapi import FastAPI

from flowyard.db.session import Database
from flowyard.queue.models import Execution
from tests.conftest import Factory, flow_body, wait_until
from tests.engine.test_engine_e2e import active_flow
from tests.engine.test_fair_claim import seed

WAITING = 1000  # the 1,000 executions waiting in a long delay


async def _by_status(db: Database) -> dict[str, int]:
    async with db.read() as session:
        rows = (
            await session.execute(sa.select(Execution.status, sa.func.count()).group_by(Execution.status))
        ).all()
    return {status: int(n) for status, n in rows}


async def test_waiting_executions_hold_no_slot(
    engine_client: httpx.AsyncClient, engine_app: FastAPI, factory: Factory, db: Database
) -> None:
    c = engine_client
    ta, tb = await factory.tenant(), await factory.tenant()
    alice, bob = await factory.user(tenant=ta), await factory.user(tenant=tb)
    slow: dict[str, Any] = flow_body(
        name="slow",
        graph={
            "nodes": [{"id": "in"}, {"id": "d", "componentId": "delay", "fields": {"seconds": 3600}}],
            "edges": [{"source": "in", "target": "d"}],
        },
    )
    fa = await active_flow(c, alice, slow)
    fb = await active_flow(c, bob, flow_body(name="quick"))
    await seed(db, WAITING, tenant=ta, owner=alice.id, flow_id=fa)

    async def all_parked() -> bool:
        return (await _by_status(db)).get("waiting", 0) == WAITING

    assert await wait_until(all_parked, within=900)
    worker = engine_app.state.engine.worker
    # Nothing of A's runs, holds a slot in the worker or a runner, or a lease.
    counts = await _by_status(db)
    assert counts.get("running", 0) == 0 and counts.get("queued", 0) == 0, counts
    stats = worker.stats()
    assert stats["running"] == 0 and all(r["running"] == 0 for r in stats["pool"]["runners"]), stats
    assert stats["parked"] >= WAITING
    async with db.read() as session:
        leased = await session.scalar(
            sa.select(sa.func.count()).select_from(Execution).where(Execution.lease_owner.is_not(None))
        )
    assert leased == 0
    # B's executions run at once, several in a row.
    for i in range(5):
        r = await c.post(f"/webhooks/{fb}", params={"wait": 30}, json={"i": i})
        assert r.status_code == 200, r.text
        assert r.json() == {"i": i}
    assert (await _by_status(db)).get("waiting") == WAITING  # and A's still wait, none resumed early
