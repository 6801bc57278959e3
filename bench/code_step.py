"""A code step against a jsonata step doing the same transform: executions per second and CPU
per execution of a ``webhook -> transform -> log`` flow, run the way a runner runs it
(``runner.run_execution`` on a compiled flow version), in one process, without the database,
HTTP or IPC (those cost the same for both; bench/datapath.py and bench/webhooks.py measure them).

    .venv/bin/python bench/code_step.py [--executions 2000]

The two are run back to back, alternating, so a busy machine weighs on both alike; figures on
a shared machine are "under load": compare the two, not runs of different days.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from flowyard.clock import utcnow
from flowyard.components import builtins
from flowyard.components.code import CODE
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.queue.records import Claimed
from flowyard.runtime.runner import CompiledFlow, run_execution

DATA: dict[str, Any] = {
    "order": {
        "id": "A-1",
        "customer": {"name": "Ada Lovelace", "email": "ADA@example.com"},
        "items": [{"sku": f"p-{i}", "price": 3.5 + i, "qty": 1 + i % 3} for i in range(10)],
    }
}
JSONATA = (
    "{'id': order.id, 'email': $lowercase(order.customer.email), "
    "'total': $sum(order.items.(price * qty)), 'skus': [order.items.$uppercase(sku)]}"
)
CODE_SOURCE = """
function main(data) {
  const o = data.order;
  let total = 0;
  for (const item of o.items) total += item.price * item.qty;
  return {id: o.id, email: o.customer.email.toLowerCase(), total,
          skus: o.items.map(item => item.sku.toUpperCase())};
}"""


def flow(component: str, fields: dict[str, Any]) -> CompiledFlow:
    graph = {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {"id": "calc", "componentId": component, "fields": fields},
            {"id": "out", "componentId": "log", "fields": {"includeData": False}},
        ],
        "edges": [{"source": "in", "target": "calc"}, {"source": "calc", "target": "out"}],
    }
    registry = Registry({c.id: c for c in (*builtins.ALL, CODE)})
    return CompiledFlow.compile(
        flow_id="f", version=1, tenant="t", owner_user="u", graph=graph, registry=registry
    )


async def measure(
    compiled: CompiledFlow, n: int, settings: Settings, http: httpx.AsyncClient
) -> tuple[float, float]:
    """(executions per second, CPU milliseconds per execution)."""
    claimed = Claimed("e", "f", 1, "t", "u", "webhook", DATA, 1, utcnow(), None)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        outcome = await run_execution(compiled, claimed, settings=settings, http=http)
        assert outcome.status == "succeeded", outcome.error
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", type=int, default=2000)
    args = parser.parse_args()
    settings = Settings()
    flows = {
        "jsonata": flow("jsonata", {"expression": JSONATA}),
        "code": flow("code", {"source": CODE_SOURCE}),
    }
    async with httpx.AsyncClient() as http:
        same = [
            (await run_execution(f, Claimed("e", "f", 1, "t", "u", "webhook", DATA, 1, utcnow(), None),
                                 settings=settings, http=http)).steps[1].output
            for f in flows.values()
        ]  # fmt: skip
        assert same[0] == same[1], f"the two transforms disagree: {same}"
        totals: dict[str, list[tuple[float, float]]] = {k: [] for k in flows}
        for _round in range(3):
            for name, compiled in flows.items():
                totals[name].append(await measure(compiled, args.executions // 3, settings, http))
    print(f"{args.executions} executions each, webhook -> transform -> log, in one process (under load)")
    for name, rounds in totals.items():
        rate = sorted(r for r, _ in rounds)[1]
        cpu = sorted(c for _, c in rounds)[1]
        print(f"  {name:8s} {rate:8.0f} executions/s   {cpu:6.3f} ms CPU per execution (median of 3 rounds)")


if __name__ == "__main__":
    asyncio.run(main())
