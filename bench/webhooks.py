"""Webhook throughput: a 3-node flow (webhook -> jsonata mapper edge -> jsonata -> log)
under 32 concurrent clients for 20 s against `flowyard serve` on SQLite.

Prints accepted webhooks/s, p50/p99 latency, completed executions/s, the lag
from acceptance to completion, RSS, and checks every accepted webhook completed.

    .venv/bin/python bench/webhooks.py [--clients 32] [--seconds 20] [--wait 5] [--api-processes N]

CPU and RSS are those of the server's whole process tree (API processes, engine, runners).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import orjson
from _common import Server, pct, post_request, run_load, summary

FLOW = {
    "name": "bench webhook flow",
    "type": "ordinary",
    "graph": {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {
                "id": "shape",
                "componentId": "jsonata",
                "fields": {"expression": "$merge([$, {'seen': true}])"},
            },
            {"id": "out", "componentId": "log", "fields": {"level": "info", "message": "order"}},
        ],
        "edges": [
            {
                "source": "in",
                "target": "shape",
                "config": {"mapper": {"orderId": "order.id", "total": "$sum(order.items.price)"}},
            },
            {"source": "shape", "target": "out"},
        ],
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--accept-only",
        action="store_true",
        help="Run the server without its engine: measures acceptance alone (nothing completes).",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        help="Send ?wait=SECONDS: each request is answered with the flow's result (200).",
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=None,
        help="flowyard serve --api-processes (default: the server's own, one per core).",
    )
    args = parser.parse_args()

    serve_args: tuple[str, ...] = ("--no-engine",) if args.accept_only else ()
    if args.api_processes is not None:
        serve_args += ("--api-processes", str(args.api_processes))
    server = Server(args=serve_args)
    server.start()
    try:
        headers = server.login()
        flow = httpx.post(f"{server.base}/flows", json=FLOW, headers=headers).json()["data"]
        httpx.post(f"{server.base}/flows/{flow['id']}/start", headers=headers).raise_for_status()
        if args.accept_only:
            with sqlite3.connect(Path(server.data_dir) / "flowyard.db") as conn:
                conn.execute("UPDATE flows SET status = 'active' WHERE id = ?", (flow["id"],))
        while (
            httpx.get(f"{server.base}/flows/{flow['id']}", headers=headers).json()["data"]["status"]
            != "active"
        ):
            time.sleep(0.1)
        payload = {"order": {"id": "A-1", "items": [{"price": 3}, {"price": 4}]}}
        rss_before = server.rss()
        cpu_before = server.cpu()
        query = f"?wait={args.wait:g}" if args.wait else ""
        load = run_load(
            server.port,
            post_request(f"/webhooks/{flow['id']}{query}", lambda i: payload),
            clients=args.clients,
            seconds=args.seconds,
            expect=200 if args.wait else 202,
            keep_bodies=not args.wait,
        )
        cpu_load = server.cpu() - cpu_before
        accepted_ids = {orjson.loads(b)["data"]["executionId"] for b in load.responses}
        drain_started = time.monotonic()
        db = Path(server.data_dir) / "flowyard.db"
        while not args.accept_only:
            with sqlite3.connect(db) as conn:
                left = conn.execute(
                    "SELECT count(*) FROM executions WHERE status IN ('queued','running')"
                ).fetchone()[0]
            if not left or time.monotonic() - drain_started > 300:
                break
            time.sleep(0.5)
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT id, status, created_at, finished_at FROM executions WHERE flow_id = ?", (flow["id"],)
            ).fetchall()
        peak = server.peak_rss
        cpu_total = server.cpu() - cpu_before
    finally:
        server.finish()

    from datetime import datetime

    from flowyard.db.compact import time_of

    def ts(v: str | int) -> float:
        # Stored compactly on SQLite since 0026 (flowyard.db.compact): integer microseconds.
        return time_of(v).timestamp() if isinstance(v, int) else datetime.fromisoformat(v).timestamp()

    if args.accept_only:
        print(
            f"accept only: {load.ok} accepted ({load.rate:.0f}/s), {len(rows)} stored; errors {load.errors or 'none'}"
        )
        print(f"webhook latency: {summary(load.latencies)}")
        print(
            f"server CPU: {cpu_load:.1f} s ({cpu_load / max(load.ok, 1) * 1000:.2f} ms per accepted webhook)"
        )
        return
    done = [r for r in rows if r[1] == "succeeded"]
    lags = [ts(r[3]) - ts(r[2]) for r in done]
    first_created = min(ts(r[2]) for r in rows)
    last_finished = max(ts(r[3]) for r in done)
    stored = {r[0].hex() if isinstance(r[0], bytes) else r[0] for r in rows}  # 12-byte ids
    mode = f"?wait={args.wait:g} (answered 200 with the result)" if args.wait else "answered 202"
    print(
        f"clients {args.clients}, {load.seconds:.1f} s of load, {mode}, server on SQLite (synchronous=FULL)"
    )
    print(f"accepted: {load.ok} ({load.rate:.0f}/s); other answers: {load.errors or 'none'}")
    print(f"webhook latency: {summary(load.latencies)}")
    print(
        f"completed: {len(done)} of {len(rows)} stored; "
        f"{len(done) / (last_finished - first_created):.0f}/s from first acceptance to last completion"
    )
    print(
        f"lag acceptance -> completion: p50 {pct(lags, 50) * 1000:.0f} ms, p99 {pct(lags, 99) * 1000:.0f} ms, "
        f"max {max(lags) * 1000:.0f} ms"
    )
    print(
        f"server CPU: {cpu_load:.1f} s during the load ({cpu_load / max(load.ok, 1) * 1000:.2f} ms per "
        f"accepted webhook), {cpu_total:.1f} s until drained ({cpu_total / max(len(done), 1) * 1000:.2f} ms per "
        "webhook, accepted and completed)"
    )
    print(f"RSS: {rss_before / 2**20:.0f} MiB before load, peak {peak / 2**20:.0f} MiB")
    missing = accepted_ids - stored
    not_done = len(rows) - len(done)
    print(
        f"every accepted webhook completed: {'yes' if not missing and not not_done else 'NO'} "
        f"(missing {len(missing)}, unfinished or failed {not_done})"
    )


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
