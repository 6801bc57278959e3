"""The runner pool with real runner processes: the culprit of a kill fails with its
limit named, what shared its runner runs again elsewhere, a runner that keeps
dying under an execution gives up on it, runners are replaced, and a runner gets
neither the service's secrets nor a say about whose execution it reports."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.ids import new_id
from flowyard.queue.store import Claimed
from flowyard.runtime.ipc import ProtocolError, outcome_from_wire
from flowyard.runtime.pool import FlowSpec, RunnerPool
from flowyard.runtime.runner import CompiledFlow

pytestmark = [pytest.mark.slow]

RUNAWAY = "($f := function($n){$f($n+1)}; $f(0))"


def _spec(registry: Registry, *steps: dict[str, Any]) -> FlowSpec:
    nodes = [{"id": "in", "componentId": "webhook"}, *steps]
    graph = {
        "nodes": nodes,
        "edges": [{"source": a["id"], "target": b["id"]} for a, b in itertools.pairwise(nodes)],
    }
    flow = CompiledFlow.compile(
        flow_id=new_id(), version=1, tenant="t-1", owner_user="u-1", graph=graph, registry=registry
    )
    return FlowSpec.of(flow, graph)


def _jsonata(expression: str) -> dict[str, Any]:
    return {"id": "calc", "componentId": "jsonata", "fields": {"expression": expression}}


def _delay(seconds: float) -> dict[str, Any]:
    return {"id": "wait", "componentId": "delay", "fields": {"seconds": seconds}}


def _claimed(spec: FlowSpec, data: Any = None) -> Claimed:
    return Claimed(
        id=new_id(),
        flow_id=spec.flow_id,
        flow_version=1,
        tenant="t-1",
        owner_user="u-1",
        trigger="webhook",
        input=data if data is not None else {},
        attempts=1,
        created_at=utcnow(),
        scheduled_for=None,
    )


@pytest.fixture
async def pool(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[RunnerPool]:
    overrides = getattr(request, "param", {})
    defaults: dict[str, Any] = {
        "runners": 1,
        "execution_cpu_seconds": 1.0,
        "step_timeout": 10,
        # These tests hold a runner with a delay step: slept in the runner, not parked.
        "delay_park_seconds": 3600,
    }
    settings = Settings(data_dir=tmp_path, **(defaults | overrides))
    p = RunnerPool(settings)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


async def _runner_pids(pool: RunnerPool, holding: int = 0) -> list[int]:
    for _ in range(400):
        pids = [r["pid"] for r in pool.stats()["runners"] if r["ready"] and r["running"] >= holding]
        if pids:
            return pids
        await asyncio.sleep(0.025)
    raise AssertionError(f"no ready runner holding {holding}: {pool.stats()}")


async def test_culprit_fails_and_its_neighbours_run_again(pool: RunnerPool, registry: Registry) -> None:
    runaway = _spec(registry, _jsonata(RUNAWAY))
    slow = _spec(registry, _delay(0.3), _jsonata("n + 1"))
    first = await pool.run(slow, _claimed(slow, {"n": 0}))  # warm: the runner is up
    assert first.status == "succeeded" and first.result == {"data": 1}
    (pid,) = await _runner_pids(pool)
    # One runner: the neighbours are aboard, awaiting, while the runaway spins.
    runs = [pool.run(slow, _claimed(slow, {"n": i})) for i in range(5)]
    culprit = _claimed(runaway)
    outcomes = await asyncio.gather(pool.run(runaway, culprit), *runs)
    bad, good = outcomes[0], outcomes[1:]
    assert bad.status == "failed" and bad.error == "step calc exceeded the 1 s CPU limit"
    assert bad.execution_id == culprit.id and bad.tenant == "t-1"
    assert [(e["level"], e["step_id"], e["component_id"]) for e in bad.logs] == [("error", "calc", "jsonata")]
    assert [o.result for o in good] == [{"data": i + 1} for i in range(5)]
    assert all(o.status == "succeeded" for o in good)
    assert pool.replaced == 1 and pool.limit_kills == 1 and pool.reruns == 5
    assert await _runner_pids(pool) != [pid], "a new runner took over"
    again = await pool.run(slow, _claimed(slow, {"n": 41}))
    assert again.result == {"data": 42}


@pytest.mark.parametrize("pool", [{"runner_memory_mb": 128}], indirect=True)
async def test_memory_bomb_fails_with_the_memory_limit(pool: RunnerPool, registry: Registry) -> None:
    bomb = _spec(registry, _jsonata("[1..10000].[1..10000]"))
    out = await pool.run(bomb, _claimed(bomb))
    assert out.status == "failed" and out.error == "step calc exceeded the 128 MiB memory limit"
    ok = _spec(registry, _jsonata("$sum([1..100])"))
    assert (await pool.run(ok, _claimed(ok))).result == {"data": 5050}


@pytest.mark.parametrize("pool", [{"execution_wall_seconds": 0.5}], indirect=True)
async def test_wall_time_limit_fails_the_execution_without_a_kill(
    pool: RunnerPool, registry: Registry
) -> None:
    slow = _spec(registry, _delay(3))
    out = await pool.run(slow, _claimed(slow))
    assert out.status == "failed" and out.error == "step wait exceeded the 0.5 s wall-time limit"
    assert [s.status for s in out.steps] == ["succeeded", "failed"]
    assert pool.replaced == 0


async def test_a_runner_that_keeps_dying_under_an_execution_gives_up(
    pool: RunnerPool, registry: Registry
) -> None:
    """Deaths nobody can be blamed for (killed from outside while the execution awaited):
    the execution runs again, but not forever."""
    slow = _spec(registry, _delay(5))
    task = asyncio.create_task(pool.run(slow, _claimed(slow)))
    for _ in range(3):
        (pid,) = await _runner_pids(pool, holding=1)
        os.kill(pid, signal.SIGKILL)
        while pid in [r["pid"] for r in pool.stats()["runners"]]:  # noqa: ASYNC110 - polling the pool
            await asyncio.sleep(0.02)
    out = await asyncio.wait_for(task, 30)
    assert out.status == "failed" and out.error == "its runner process died 3 times while running it"
    assert pool.replaced == 3 and pool.limit_kills == 0 and pool.reruns == 2


async def test_runners_get_no_secrets(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWYARD_SECRET_KEY", "do-not-leak-this")
    monkeypatch.setenv("FLOWYARD_DATABASE_URL", "postgresql+asyncpg://u:do-not-leak-this@127.0.0.1/db")
    settings = Settings(data_dir=tmp_path, runners=1)
    assert settings.secret_key is not None
    pool = RunnerPool(settings)
    await pool.start()
    try:
        (pid,) = await _runner_pids(pool)
        environ = _read(f"/proc/{pid}/environ")
        assert b"do-not-leak-this" not in environ and b"FLOWYARD_" not in environ
        assert b"do-not-leak-this" not in _read(f"/proc/{pid}/cmdline")
    finally:
        await pool.close()


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def test_identity_comes_from_the_engine_not_the_runner(registry: Registry) -> None:
    spec = _spec(registry, _jsonata("1"))
    claimed = _claimed(spec)
    now = utcnow().isoformat()
    forged_log = [now, "error", "hello", "calc", "jsonata", None]
    wire: list[Any] = ["succeeded", {"data": 1}, None, now, [], [forged_log]]
    out = outcome_from_wire(wire, claimed, spec.flow_id, spec.node_ids)
    entry = out.logs[0]
    assert (entry["tenant"], entry["flow_id"], entry["execution_id"]) == ("t-1", spec.flow_id, claimed.id)
    for bad in (
        ["running", None, None, now, [], []],
        ["succeeded", None, None, "yesterday", [], []],
        ["succeeded", None, None, now, [["elsewhere", *[None] * 12]], []],
        ["succeeded"],
    ):
        with pytest.raises(ProtocolError):
            outcome_from_wire(bad, claimed, spec.flow_id, spec.node_ids)
