"""CPU shares between tenants (issue 17), with the real pool and real runner processes.

A tenant whose runner's loop is held by a CPU-bound step gets a second runner for its next
execution instead of queueing behind the busy loop; while two tenants have work, a tenant's
runners beyond its first run at a lower priority (niceness raised by
FLOWYARD_RUNNER_DEMOTE_NICE), read here from /proc; a demoted runner is replaced once empty.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from flowyard.components.registry import Registry
from flowyard.queue.store import queue_group_of
from flowyard.runtime.pool import RunnerPool
from tests.conftest import wait_until
from tests.engine.test_pool import _claimed, _delay, _spec, pool

__all__ = ["pool"]

pytestmark = [pytest.mark.slow]


def _burn(loops: int) -> dict[str, object]:
    source = f"function main(d) {{ let s = 0; for (let i = 0; i < {loops}; i++) s += i % 7; return {{s}}; }}"
    return {"id": "calc", "componentId": "code", "fields": {"source": source}}


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def _ready(pool: RunnerPool) -> list[dict[str, object]]:
    return [r for r in pool.stats()["runners"] if r["ready"]]


@pytest.mark.parametrize(
    "pool",
    [
        {
            "runners": 2,
            "runners_warm": 1,
            "runner_surge": 1,
            "execution_cpu_seconds": 20,
            "code_cpu_seconds": 20,
            "step_timeout": 60,
        }
    ],
    indirect=True,
)
async def test_a_busy_loop_gets_a_second_runner_and_extra_runners_are_demoted(
    pool: RunnerPool, registry: Registry
) -> None:
    burn = _spec(registry, _burn(30_000_000))  # seconds of CPU in constant memory
    await wait_until(lambda: _now(len(_ready(pool)) == 1), within=30)
    await asyncio.sleep(0.5)
    assert len(_ready(pool)) == 1, "one runner started with the pool (FLOWYARD_RUNNERS_WARM=1)"
    a1 = asyncio.ensure_future(pool.run(burn, _claimed(burn, {"n": 1})))
    await wait_until(lambda: _now(any(s.hot for s in pool.placement.seats.values())), within=30)
    a2 = asyncio.ensure_future(pool.run(burn, _claimed(burn, {"n": 2})))
    # Its runner is hot: the second base runner is started on demand, not a surge one.
    await wait_until(lambda: _now(sorted(r["running"] for r in _ready(pool)) == [1, 1]), within=30)
    assert not any(r["surge"] for r in _ready(pool))
    assert pool.demoted == 0, "one tenant at work: nobody is demoted"
    base = pool.settings.runner_nice
    assert sorted(_nice(int(r["pid"])) for r in _ready(pool)) == [base, base]

    quick = _spec(registry, _burn(1000))
    theirs = dataclasses.replace(_claimed(quick, {"n": 9}), tenant="t-2")
    b = await pool.run(quick, theirs)  # t-2 holds no runner: a surge one, at the base priority
    assert b.status == "succeeded"
    assert pool.demoted == 1
    demoted = base + pool.settings.runner_demote_nice
    assert sorted(_nice(int(r["pid"])) for r in _ready(pool) if r["running"]) == [base, demoted]

    done = await asyncio.gather(a1, a2)
    assert [(o.status, o.error) for o in done] == [("succeeded", None)] * 2

    # The demoted runner stopped once empty (it cannot be raised again); with one warm runner
    # it is not replaced: the next need starts one on demand. Every runner left is at the base
    # priority.
    def settled() -> bool:
        ready = _ready(pool)
        base_runners = [r for r in ready if not r["surge"]]
        return len(base_runners) == 1 and {_nice(int(r["pid"])) for r in ready} == {base}

    await wait_until(lambda: _now(settled()), within=30)


@pytest.mark.parametrize(
    "pool",
    [{"runners": 2, "runners_warm": 2, "runner_surge": 0, "execution_cpu_seconds": 0.5}],
    indirect=True,
)
async def test_a_tenant_that_kills_a_runner_runs_demoted_while_another_has_work(
    pool: RunnerPool, registry: Registry
) -> None:
    """A's execution crosses the CPU limit and its runner is killed: A is charged. While B has
    work, the runner started in its place is demoted from the start (its start-up too) and
    kept for A; A's next execution runs there, at the lower priority; B's runner keeps the
    base priority.
    """
    await wait_until(lambda: _now(len(_ready(pool)) == 2), within=30)
    base = pool.settings.runner_nice
    demoted = base + pool.settings.runner_demote_nice
    hold = _spec(registry, _delay(8))
    b = asyncio.ensure_future(pool.run(hold, dataclasses.replace(_claimed(hold), tenant="t-2")))
    await wait_until(lambda: _now(sum(r["running"] for r in _ready(pool)) == 1), within=30)
    runaway = _spec(registry, {"id": "calc", "componentId": "jsonata", "fields": {"expression": RUNAWAY}})
    killed = await pool.run(runaway, _claimed(runaway))
    assert killed.status == "failed" and "CPU" in (killed.error or ""), killed.error
    assert list(pool.placement.penalty) == [queue_group_of("t-1", "u-1")], "A is charged, not B"

    def replaced_demoted() -> bool:
        ready = _ready(pool)
        return len(ready) == 2 and sorted(_nice(int(r["pid"])) for r in ready) == [base, demoted]

    await wait_until(lambda: _now(replaced_demoted()), within=30)
    short = _spec(registry, _delay(1))
    a = asyncio.ensure_future(pool.run(short, _claimed(short)))
    await wait_until(lambda: _now(sum(r["running"] for r in _ready(pool)) == 2), within=30)
    assert sorted(_nice(int(r["pid"])) for r in _ready(pool) if r["running"]) == [base, demoted]
    assert (await a).status == "succeeded"
    assert (await b).status == "succeeded"


RUNAWAY = "($f := function($n){$f($n+1)}; $f(0))"


async def _now(value: bool) -> bool:
    return value
