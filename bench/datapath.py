"""CPU of the database half of a webhook-triggered execution, in one process, without HTTP
or runners: accept (group-committed insert), claim, record the outcome (3 steps, 4 logs,
counters), and the ``?wait=`` read. A profile aid for the lean data path (issue 8): CPU time
is less sensitive to a busy machine than throughput.

    .venv/bin/python bench/datapath.py [--executions 4000] [--batch 64] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from flowyard.clock import utcnow
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from flowyard.ids import new_id
from flowyard.queue import store as queue
from flowyard.queue.accept import Accepted, WebhookRequest, accept_batch
from flowyard.queue.records import Outcome, StepRecord
from flowyard.webhooks import handler

PAYLOAD = {"order": {"id": "A-1", "items": [{"price": 3}, {"price": 4}]}}


def outcome(c: queue.Claimed) -> Outcome:
    now = utcnow()
    steps, logs = [], []
    for i, (node, cid) in enumerate((("in", "webhook"), ("shape", "jsonata"), ("out", "log"))):
        steps.append(StepRecord(node, cid, None, "succeeded", 1, 1, 1, 0.05, now, now, None, {"n": i}, i))
        logs.append(
            {
                "tenant": c.tenant,
                "user_id": c.owner_user,
                "flow_id": c.flow_id,
                "execution_id": c.id,
                "timestamp": now,
                "level": "info",
                "message": f"step {node} ran 1 time(s)",
                "step_id": node,
                "component_id": cid,
                "data": {"runs": 1, "messagesIn": 1, "messagesOut": 1, "durationMs": 0.05},
            }
        )
    logs.append({**logs[-1], "message": "order", "data": {"orderId": "A-1", "total": 7}})
    return Outcome(
        c.id, c.flow_id, c.tenant, c.owner_user, c.created_at, "succeeded",
        {"data": {"orderId": "A-1", "total": 7, "seen": True}}, None, now + timedelta(milliseconds=1),
        steps, logs,
    )  # fmt: skip


async def run(args: argparse.Namespace) -> None:
    path = Path(tempfile.mkdtemp(prefix="flowyard-datapath-")) / "db.sqlite"
    url = f"sqlite+aiosqlite:///{path}"
    await migrate.upgrade_async(url)
    db = Database(url)
    fid = new_id()
    async with db.write() as s:
        now = utcnow()
        s.add(
            Flow(
                id=fid, name="bench", name_lc="bench", type="ordinary", graph={}, status="active",
                owners=[{"type": "user", "id": "u1"}], status_changed_at=now, tenant="t1",
            )
        )  # fmt: skip
    raw = handler.orjson.dumps(PAYLOAD)
    phases = {"accept": 0.0, "claim": 0.0, "complete": 0.0, "read": 0.0}
    prof = cProfile.Profile() if args.profile else None
    done = 0
    worker = "bench:1"
    while done < args.executions:
        if prof:
            prof.enable()
        t = time.process_time()
        batch = [WebhookRequest(fid, PAYLOAD, "", raw, None, None) for _ in range(args.batch)]
        accepted = await db.transact(lambda s, b=batch: accept_batch(s, b))
        t1 = time.process_time()
        claimed = await db.transact(
            lambda s: queue.claim(s, worker_id=worker, limit=args.batch, lease_seconds=30, cap=0),
            durable=False,
        )
        t2 = time.process_time()
        outcomes = [outcome(c) for c in claimed]
        await db.transact(lambda s, o=outcomes: queue.complete(s, o, worker_id=worker), durable=False)
        t3 = time.process_time()
        for a in list(accepted.values())[: args.batch // 4]:
            assert isinstance(a, Accepted)
            await handler._read_finished(db, a.execution_id)
        t4 = time.process_time()
        if prof:
            prof.disable()
        assert len(claimed) == args.batch, len(claimed)
        phases["accept"] += t1 - t
        phases["claim"] += t2 - t1
        phases["complete"] += t3 - t2
        phases["read"] += (t4 - t3) * 4
        done += args.batch
    thread_cpu = _database_thread_cpu()
    await db.dispose()
    total = sum(v for k, v in phases.items() if k != "read")
    print(f"{done} executions in batches of {args.batch} on SQLite; CPU ms per execution:")
    for k, v in phases.items():
        print(f"  {k:9s} {1000 * v / done:.3f}")
    print(f"  accept+claim+complete {1000 * total / done:.3f}")
    if thread_cpu is not None:
        # The three transactions run whole on the database's own thread (Database.transact):
        # its clock alone, steadier than the process's on a busy machine.
        print(f"  of which the database thread {1000 * thread_cpu / done:.3f}")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)


def _database_thread_cpu() -> float | None:
    """Seconds of CPU (user + system) the direct SQLite transactions' thread has used."""
    for thread in threading.enumerate():
        if thread.name.startswith("flowyard-sqlite") and thread.native_id is not None:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
