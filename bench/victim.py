"""The victim benchmark (issue 17): does one tenant's attack slow down another tenant?

    .venv/bin/python bench/victim.py [--b 100] [--bombs 50] [--burners 50] [--burn 4000000]
                                     [--rate 20] [--keep]

Starts `flowyard serve` (SQLite) and, as the administrator, two tenants with one member
each. Tenant B's flow is webhook -> a `code` step looping `--burn` times -> log (constant
memory; set `--burn` so that one of B's executions burns about 0.3 s of CPU: B's p50 without
the attack shows it); tenant A's flows are a memory bomb (`[1..10000].[1..10000]`) and a CPU
burner (an endless recursion). Then, twice:

1. without the attack: B's `--b` executions, posted at `--rate` per second;
2. with the attack: the same, while A posts `--bombs` memory bombs and `--burners` CPU
   burners at the same time.

For each run it prints B's completion latency (the execution's createdAt to finishedAt,
from the API) at p50 and p99, and the ratio of the two p99s. It exits 1 if any of B's
executions did not succeed, or any of A's did not fail. Everything talks to 127.0.0.1.
Small counts (`--b 10 --bombs 5 --burners 5`) check that it works; figures worth keeping
come from a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import datetime
from typing import Any

import httpx
from _common import Server, pct

BOMB = "[1..10000].[1..10000]"
RUNAWAY = "($f := function($n){$f($n+1)}; $f(0))"
PASSWORD = "victim bench password"


def jsonata_flow(name: str, expression: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "calc", "componentId": "jsonata", "fields": {"expression": expression}},
                {"id": "out", "componentId": "log"},
            ],
            "edges": [{"source": "in", "target": "calc"}, {"source": "calc", "target": "out"}],
        },
    }


def code_flow(name: str, loops: int) -> dict[str, Any]:
    """webhook -> a code step that burns CPU in constant memory (``loops`` iterations) -> log."""
    source = (
        f"function main(data) {{ let s = 0; for (let i = 0; i < {loops}; i++) s += i % 7; return {{s}}; }}"
    )
    return {
        "name": name,
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "calc", "componentId": "code", "fields": {"source": source}},
                {"id": "out", "componentId": "log"},
            ],
            "edges": [{"source": "in", "target": "calc"}, {"source": "calc", "target": "out"}],
        },
    }


def member(server: Server, admin: dict[str, str], name: str) -> dict[str, str]:
    """A tenant and its member (all permissions in the tenant); that member's headers."""
    r = httpx.post(f"{server.base}/tenants", json={"name": name}, headers=admin)
    r.raise_for_status()
    tenant = r.json()["data"]["id"]
    username = f"{name}@example.com"
    r = httpx.post(
        f"{server.base}/api/users",
        json={"username": username, "password": PASSWORD, "tenant": tenant, "permissions": ["all"]},
        headers=admin,
    )
    r.raise_for_status()
    return server.login(username, PASSWORD)


def active_flow(server: Server, who: dict[str, str], body: dict[str, Any]) -> str:
    r = httpx.post(f"{server.base}/flows", json=body, headers=who)
    r.raise_for_status()
    fid = str(r.json()["data"]["id"])
    httpx.post(f"{server.base}/flows/{fid}/start", headers=who).raise_for_status()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(f"{server.base}/flows/{fid}", headers=who).json()["data"]["status"] == "active":
            return fid
        time.sleep(0.1)
    raise SystemExit(f"flow {fid} did not start")


async def post_paced(client: httpx.AsyncClient, fid: str, n: int, rate: float) -> list[str]:
    ids: list[str] = []
    started = time.monotonic()
    for i in range(n):
        delay = started + i / rate - time.monotonic()
        if rate > 0 and delay > 0:
            await asyncio.sleep(delay)
        r = await client.post(f"/webhooks/{fid}", json={"i": i})
        r.raise_for_status()
        ids.append(str(r.json()["data"]["executionId"]))
    return ids


async def outcomes(
    client: httpx.AsyncClient, who: dict[str, str], ids: list[str], within: float
) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + within
    while len(done) < len(ids) and time.monotonic() < deadline:
        for eid in [e for e in ids if e not in done]:
            r = await client.get(f"/executions/{eid}", headers=who)
            e = r.json()["data"]
            if e["status"] in ("succeeded", "failed", "cancelled"):
                done[eid] = e
        await asyncio.sleep(0.5)
    return done


def _seconds(start: str, end: str) -> float:
    parse = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def latency(e: dict[str, Any]) -> float:
    created = datetime.fromisoformat(e["createdAt"].replace("Z", "+00:00"))
    finished = datetime.fromisoformat(e["finishedAt"].replace("Z", "+00:00"))
    return (finished - created).total_seconds()


async def run(
    server: Server,
    a: dict[str, str],
    b: dict[str, str],
    flows: dict[str, str],
    args: argparse.Namespace,
    attack: bool,
) -> tuple[list[float], bool]:
    async with httpx.AsyncClient(base_url=server.base, timeout=30) as anonymous:
        posts = [post_paced(anonymous, flows["victim"], args.b, args.rate)]
        if attack:
            spread = args.b / args.rate if args.rate > 0 else 0.0
            posts.append(
                post_paced(anonymous, flows["bomb"], args.bombs, args.bombs / spread if spread else 0)
            )
            posts.append(
                post_paced(anonymous, flows["burner"], args.burners, args.burners / spread if spread else 0)
            )
        posted = await asyncio.gather(*posts)
        victims = await outcomes(anonymous, b, posted[0], args.timeout)
        ok = len(victims) == args.b and all(e["status"] == "succeeded" for e in victims.values())
        if not ok:
            bad = [(e["status"], e.get("error")) for e in victims.values() if e["status"] != "succeeded"]
            print(f"  B: {len(victims)}/{args.b} finished; not succeeded: {bad[:5]}", file=sys.stderr)
        if attack:
            attackers = await outcomes(anonymous, a, [*posted[1], *posted[2]], args.timeout)
            failed = sum(e["status"] == "failed" for e in attackers.values())
            print(f"  A: {failed}/{args.bombs + args.burners} failed (expected: all)")
            ok = ok and failed == args.bombs + args.burners
        done = [e for e in victims.values() if e.get("finishedAt") and e.get("startedAt")]
        waits = [_seconds(e["createdAt"], e["startedAt"]) for e in done]
        steps = [
            s["durationMs"] / 1000 for e in done for s in e.get("steps", []) if s.get("nodeId") == "calc"
        ]
        if waits and steps:
            # Where B's time goes: waiting for a slot and runner, or in its step (CPU contention).
            print(
                f"  B: queued p50 {pct(waits, 50):.3f} s p99 {pct(waits, 99):.3f} s; "
                f"code step p50 {pct(steps, 50):.3f} s p99 {pct(steps, 99):.3f} s"
            )
        return [latency(e) for e in victims.values() if e.get("finishedAt")], ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--b", type=int, default=100, help="tenant B's executions per run")
    parser.add_argument("--bombs", type=int, default=50, help="tenant A's memory bombs")
    parser.add_argument("--burners", type=int, default=50, help="tenant A's CPU burners")
    parser.add_argument("--burn", type=int, default=4000000, help="loops of B's code step (~0.3 s of CPU)")
    parser.add_argument("--rate", type=float, default=20.0, help="B's webhooks per second")
    parser.add_argument("--cpu-seconds", type=float, default=2.0, help="FLOWYARD_EXECUTION_CPU_SECONDS")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a run to finish")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()
    server = Server(
        env_extra={
            "FLOWYARD_EXECUTION_CPU_SECONDS": str(args.cpu_seconds),
            "FLOWYARD_WEBHOOK_RATE_LIMIT": "0",
            "FLOWYARD_LOG_LEVEL": "error",
        }
    )
    server.start()
    try:
        admin = server.login()
        a, b = member(server, admin, "attacker"), member(server, admin, "victim")
        flows = {
            "victim": active_flow(server, b, code_flow("victim", args.burn)),
            "bomb": active_flow(server, a, jsonata_flow("bomb", BOMB)),
            "burner": active_flow(server, a, jsonata_flow("burner", RUNAWAY)),
        }
        results: dict[str, list[float]] = {}
        ok = True
        for attack in (False, True):
            label = "with the attack" if attack else "without the attack"
            print(f"{label}:")
            lat, good = asyncio.run(run(server, a, b, flows, args, attack))
            results[label] = lat
            ok = ok and good
            print(f"  B: p50 {pct(lat, 50):.3f} s, p99 {pct(lat, 99):.3f} s ({len(lat)} executions)")
        base, hit = (pct(results[k], 99) for k in ("without the attack", "with the attack"))
        print(f"B's p99 with / without the attack: {hit / base:.2f}x" if base else "no baseline")
    finally:
        server.finish(keep=args.keep)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
