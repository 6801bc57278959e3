"""Execution counts (SPEC §8, `GET /icenter/executions`) for 10,000,000
executions over 90 days in 1,000 flows (100 users in 10 tenants, 3 components
per flow), served by `flowyard serve` on SQLite.

Counts are served from the per-day counter tables (flow_day_counts,
component_day_counts) and their weekly and monthly rollups, so the bench loads
the counters equivalent to those 10M executions through flowyard.queue.counters,
the upserts the engine runs when it accepts executions and when it records
their steps, instead of 10M
execution rows. Each flow-day's executions arrive in several increments (the
first inserts, the rest update), one write transaction per day.

Then measures groupby=user|flow|component over the default time frame (one
month) and the full 90 days, as admin and as a tenant member: latency of 200
sequential requests, and 16 concurrent clients for 5 s. Target: under 50 ms.

    .venv/bin/python bench/stats.py [--executions 10000000] [--days 90] [--flows 1000] \
        [--tenants 10] [--users 10] [--requests 200] [--clients 16] [--seconds 5] \
        [--keep | --reuse DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import math
import random
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import sqlalchemy as sa
from _common import Server, get_request, pct, run_load
from _seed import Capture, People, create_people, database, load_flows, one_line, reload_people

from flowyard.executions import service as executions
from flowyard.iam.principal import Principal
from flowyard.queue import counters
from flowyard.queue.models import ComponentDayCount, ComponentPeriodCount, FlowDayCount, FlowPeriodCount
from flowyard.queue.store import owner_user_of

LAST_NODES = ("log", "http", "filter", "split")
TARGET_MS = 50.0


def flow_body(i: int, rng: random.Random) -> dict[str, Any]:
    last = rng.choice(LAST_NODES)
    fields: dict[str, Any] = {
        "log": {"level": "info", "message": "done"},
        "http": {"url": "https://example.com/hook", "method": "POST"},
        "filter": {"condition": "total > 10"},
        "split": {"expression": "items"},
    }[last]
    return {
        "name": f"Counted flow {i:04d}",
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "map", "componentId": "jsonata", "fields": {"expression": "$"}},
                {"id": "out", "componentId": last, "fields": fields},
            ],
            "edges": [{"source": "in", "target": "map"}, {"source": "map", "target": "out"}],
        },
    }


def distribute(total: int, weights: list[float]) -> list[int]:
    """Integers proportional to ``weights`` that add up to exactly ``total``."""
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    out = [math.floor(x) for x in exact]
    by_fraction = sorted(range(len(exact)), key=lambda k: exact[k] - out[k], reverse=True)
    for k in by_fraction[: total - sum(out)]:
        out[k] += 1
    return out


async def load(args: argparse.Namespace, server: Server) -> tuple[People, date]:
    db = database(server.data_dir)
    rng = random.Random(7)
    try:
        started = time.perf_counter()
        people = await create_people(db, args.tenants, args.users)
        flows = await load_flows(
            db, people, args.flows, flow_body, status_for=lambda r: "active", span_days=args.days + 30
        )
        today = datetime.now(UTC).date()
        days = [today - timedelta(days=d) for d in range(args.days - 1, -1, -1)]
        # Skewed flows (a few busy ones), quieter weekends, day-to-day noise.
        flow_w = [rng.lognormvariate(0, 1.2) for _ in flows]
        day_w = [(0.4 if d.weekday() >= 5 else 1.0) * rng.uniform(0.8, 1.2) for d in days]
        cells = distribute(args.executions, [fw * dw for dw in day_w for fw in flow_w])
        parts = args.increments
        upserts = 0
        for di, day in enumerate(days):
            async with db.write() as session:
                for part in range(parts):
                    flow_rows: list[dict[str, Any]] = []
                    comp_rows: list[dict[str, Any]] = []
                    for fi, f in enumerate(flows):
                        total = cells[di * len(flows) + fi]
                        n = total // parts + (1 if part < total % parts else 0)
                        if not n:
                            continue
                        user = owner_user_of(f["owners"])
                        flow_rows.append(
                            {
                                "day": day,
                                "flow_id": f["id"],
                                "tenant": f["tenant"],
                                "user_id": user,
                                "flow_name": f["name"],
                                "executions": n,
                            }
                        )
                        # Each execution runs each of the flow's 3 nodes once.
                        for node in f["graph"]["nodes"]:
                            comp_rows.append(
                                {
                                    "day": day,
                                    "component_id": node["componentId"],
                                    "flow_id": f["id"],
                                    "tenant": f["tenant"],
                                    "user_id": user,
                                    "steps": n,
                                }
                            )
                    await counters.add_flow_counts(session, flow_rows)
                    await counters.add_component_counts(session, comp_rows)
                    upserts += len(flow_rows) + len(comp_rows)
        async with db.read() as session:
            stored = await session.scalar(sa.select(sa.func.sum(FlowDayCount.executions)))
            n_flow = await session.scalar(sa.select(sa.func.count()).select_from(FlowDayCount))
            n_comp = await session.scalar(sa.select(sa.func.count()).select_from(ComponentDayCount))
            n_rollups = [
                await session.scalar(sa.select(sa.func.count()).select_from(t))
                for t in (FlowPeriodCount, ComponentPeriodCount)
            ]
        print(
            f"loaded counters for {stored:,} executions ({args.days} days, {len(flows)} flows, "
            f"{sum(len(u) for u in people.users)} users, {len(people.tenants)} tenants) through "
            f"flowyard.queue.counters (the engine's upserts), not execution rows: {upserts:,} daily "
            f"upserts ({parts} per flow-day) with their rollups; rows: {n_flow:,} flow_day_counts, "
            f"{n_comp:,} component_day_counts, {n_rollups[0]:,} flow_period_counts, "
            f"{n_rollups[1]:,} component_period_counts; "
            f"{time.perf_counter() - started:.0f} s"
        )
        if stored != args.executions:
            raise SystemExit(f"counter total {stored} != {args.executions}")
        return people, today
    finally:
        await db.dispose()


async def reload(server: Server) -> tuple[People, date]:
    """People and the last counted day of a data directory an earlier run kept (``--keep``)."""
    db = database(server.data_dir)
    try:
        people = await reload_people(db)
        async with db.read() as session:
            last = await session.scalar(sa.select(sa.func.max(FlowDayCount.day)))
        if last is None:
            raise SystemExit(f"no counters in {server.data_dir}")
        return people, last
    finally:
        await db.dispose()


async def explain(people: People, server: Server, start: date, end: date) -> None:
    db = database(server.data_dir)
    cap = Capture(db)
    callers = {
        "member": people.principal(people.users[0][0], people.tenants[0]),
        "admin": Principal(people.admin_id, "admin", None, frozenset({"all"}), ""),
    }
    try:
        for group in executions.GROUPINGS:
            for who, principal in callers.items():

                async def call(session: Any, p: Principal = principal, g: str = group) -> None:
                    await executions.counts(session, p, start=start, end=end, groupby=g)

                print(f"\ngroupby={group} as {who}, {start} .. {end}:")
                for sql, params in await cap.run(call):
                    lines, ms = await cap.explain(sql, params, repeat=10)
                    print(f"  SQL ({ms:.2f} ms alone): {one_line(sql)}")
                    for line in lines:
                        print(f"    {line}")
    finally:
        await db.dispose()


def sequential(server: Server, path: str, headers: dict[str, str], n: int) -> tuple[list[float], int]:
    """``n`` requests one after another on one keep-alive connection; latencies and non-200s."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    latencies, bad = [], 0
    try:
        for _ in range(n):
            started = time.perf_counter()
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            latencies.append(time.perf_counter() - started)
            bad += resp.status != 200
    finally:
        conn.close()
    return latencies, bad


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--flows", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--users", type=int, default=10, help="Users per tenant.")
    parser.add_argument(
        "--increments", type=int, default=2, help="Counter upserts per flow-day (1st inserts, rest update)."
    )
    parser.add_argument("--requests", type=int, default=200, help="Sequential requests per case.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0, help="Concurrent load per case.")
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the data directory (it is deleted otherwise)."
    )
    parser.add_argument(
        "--reuse",
        metavar="DIR",
        help="Serve the counters of a data directory an earlier run kept (--keep) instead of loading "
        "them again (the frames end on its last counted day; before/after runs read the same rows). Kept.",
    )
    args = parser.parse_args()

    if args.reuse:
        server = Server(data_dir=Path(args.reuse))
        args.keep = True
        server.start()  # migrates the kept database to this code's head
        server.stop()
        people, today = asyncio.run(reload(server))
    else:
        server = Server()
        server.start()  # migrates and creates the admin
        server.stop()
        people, today = asyncio.run(load(args, server))
    first = today - timedelta(days=args.days - 1)
    if not args.no_explain:
        print("\n== query plans (full frame) ==")
        asyncio.run(explain(people, server, first, today))

    server.start()
    try:
        callers = {"member": server.login(*people.member(0)), "admin": server.login()}
        frames = {"default frame": "", f"{args.days} days": f"&start={first}&end={today}"}
        print(
            f"\n== {args.requests} sequential requests, then {args.clients} clients x {args.seconds:.0f} s; "
            f"SQLite, engine on; target < {TARGET_MS:.0f} ms =="
        )
        for group in ("user", "flow", "component"):
            for frame, extra in frames.items():
                for who, headers in callers.items():
                    path = f"/icenter/executions?groupby={group}{extra}"
                    body = orjson.loads(httpx.get(server.base + path, headers=headers, timeout=30).content)
                    seq, bad = sequential(server, path, headers, args.requests)
                    cpu = server.cpu()
                    res = run_load(
                        server.port,
                        get_request(lambda i, p=path: p, headers),
                        clients=args.clients,
                        seconds=args.seconds,
                    )
                    cpu = server.cpu() - cpu
                    ms = [v * 1000 for v in seq]
                    verdict = (
                        "ok" if pct(ms, 99) < TARGET_MS else ("p50 ok" if pct(ms, 50) < TARGET_MS else "SLOW")
                    )
                    print(
                        f"groupby={group:<9} {frame:<13} {who:<6} {len(body['data']):>4} records, "
                        f"total {body['metadata']['totalExecutions']:>10,} | sequential p50 {pct(ms, 50):6.1f} ms "
                        f"p99 {pct(ms, 99):6.1f} ms [{verdict}]{f' ({bad} errors)' if bad else ''} | "
                        f"{args.clients} clients: {res.rate:5.0f} req/s, p50 {pct(res.latencies, 50) * 1000:6.1f} ms "
                        f"p99 {pct(res.latencies, 99) * 1000:6.1f} ms, errors {res.errors or 'none'}, "
                        f"CPU {cpu / max(res.ok, 1) * 1000:.1f} ms/req"
                    )
        print(f"server RSS {server.rss() / 2**20:.0f} MiB, peak {server.peak_rss / 2**20:.0f} MiB")
    finally:
        server.finish(keep=args.keep)


if __name__ == "__main__":
    main()
