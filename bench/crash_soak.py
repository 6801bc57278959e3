"""Crash soak: SIGKILL the whole `flowyard serve` process tree (supervisor, API processes,
engine, runners) again and again under webhook load on SQLite, restart it each time, and
check that nothing acknowledged was lost.

    .venv/bin/python bench/crash_soak.py [--kills 30] [--api-processes 2] [--rate 60]
                                         [--clients 8] [--max-seconds 900]

Clients on 127.0.0.1 post webhooks all along (a new body after every error; a request
the crash cut off was never acknowledged). The flow is webhook -> delay -> log, so work is
queued and running at every kill. After each restart it measures the stall: the time from
starting the new `serve` to the first execution that had been acknowledged (answered 202)
before the kill finishing (if none was unfinished at the kill: the first execution
finishing); beside it, the time until `/health/ready` answers, and the CPU seconds the new
tree had used when the queue moved (the figure a loaded machine does not distort). At the
end it waits for the queue to drain and checks that every acknowledged execution exists,
succeeded and was recorded exactly once (one `log` node entry each: the outcome of a run
cut off by a kill is never recorded, so a re-run cannot make two). Bounded: `--kills` kills
and `--max-seconds` in all; it stops by itself and exits 1 if anything was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
from _common import ADMIN, Server, pct

FLOW = {
    "name": "crash soak flow",
    "type": "ordinary",
    "graph": {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {"id": "wait", "componentId": "delay", "fields": {"seconds": 0.2}},
            {"id": "out", "componentId": "log", "fields": {"level": "info", "message": "soak"}},
        ],
        "edges": [{"source": "in", "target": "wait"}, {"source": "wait", "target": "out"}],
    },
}
UNFINISHED = ("queued", "running")


class Load:
    """Clients posting webhooks in a thread of their own; keeps what was acknowledged."""

    def __init__(self, base: str, flow_id: str, *, clients: int, rate: float) -> None:
        self.url = f"{base}/webhooks/{flow_id}"
        self.clients = clients
        self.interval = clients / rate if rate > 0 else 0.0
        self.acknowledged: list[tuple[str, float]] = []  # execution id, monotonic time of the 202
        self.errors = 0
        self.other: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._n = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _main(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(self.clients)))

    async def _client(self) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                self._n += 1
                try:
                    r = await client.post(self.url, json={"n": self._n, "pad": "x" * 64})
                except httpx.HTTPError:
                    self.errors += 1  # the server is down or was killed mid-request
                    await asyncio.sleep(0.05)
                    continue
                if r.status_code == 202:
                    self.acknowledged.append((r.json()["data"]["executionId"], time.monotonic()))
                else:
                    self.other[r.status_code] = self.other.get(r.status_code, 0) + 1
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))


def kill_tree(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the supervisor and every process below it, leaves first; returns how many."""
    root = psutil.Process(proc.pid)
    tree = [*root.children(recursive=True), root]
    for p in reversed(tree[:-1]):  # runners, engine, API processes, then the supervisor
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for p in tree:
        try:
            p.wait(timeout=10)
        except psutil.Error:
            pass
    return len(tree)


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) the live process tree under ``pid`` has used so far."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _hex(cell: str | bytes) -> str:
    return cell.hex() if isinstance(cell, bytes) else cell


def unfinished(db: Path, sample: int = 500) -> list[str | bytes]:
    """Ids as stored (bytes, flowyard.db.compact), for ``any_finished`` to bind as they are."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT id FROM executions WHERE status IN ('queued', 'running') ORDER BY id LIMIT ?",
                (sample,),
            )
        ]


def finished_count(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM executions WHERE status NOT IN ('queued', 'running')"
            ).fetchone()[0]
        )


def any_finished(db: Path, ids: list[str | bytes]) -> bool:
    marks = ",".join("?" * len(ids))
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        row = conn.execute(
            f"SELECT 1 FROM executions WHERE id IN ({marks}) AND status NOT IN ('queued', 'running') LIMIT 1",
            ids,
        ).fetchone()
    return row is not None


def ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health/ready", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--api-processes", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=float, default=60.0, help="Webhooks per second offered in all.")
    parser.add_argument(
        "--run-seconds", type=float, default=2.0, help="Load between a restart's recovery and the next kill."
    )
    parser.add_argument("--max-seconds", type=float, default=900.0, help="Stop after this long in all.")
    parser.add_argument("--keep", action="store_true", help="Keep the data directory.")
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_seconds
    rng = random.Random(15)

    server = Server(args=("--api-processes", str(args.api_processes)))  # SQLite: <data dir>/flowyard.db
    server.start()
    db = server.data_dir / "flowyard.db"
    headers = server.login(*ADMIN)
    flow = httpx.post(f"{server.base}/flows", json=FLOW, headers=headers).json()["data"]
    httpx.post(f"{server.base}/flows/{flow['id']}/start", headers=headers).raise_for_status()
    while (
        httpx.get(f"{server.base}/flows/{flow['id']}", headers=headers).json()["data"]["status"] != "active"
    ):
        time.sleep(0.1)

    load = Load(server.base, flow["id"], clients=args.clients, rate=args.rate)
    load.start()
    stalls: list[float] = []
    readies: list[float] = []
    cpus: list[float] = []  # CPU seconds the new tree used until the queue moved
    pending_at_kill: list[int] = []
    processes = 0
    kills = 0
    started = time.monotonic()
    loadavg: list[float] = []
    try:
        while kills < args.kills and time.monotonic() < deadline:
            time.sleep(args.run_seconds * rng.uniform(0.5, 1.5))
            assert server.proc is not None
            processes += kill_tree(server.proc)
            kills += 1
            loadavg.append(os.getloadavg()[0])
            waiting = unfinished(db)
            pending_at_kill.append(len(waiting))
            # Nothing was in flight (rare): then the first execution of any kind finishing.
            done_before = finished_count(db) if not waiting else 0
            restarted = time.monotonic()
            server.proc = subprocess.Popen(
                server.proc.args, env=server_env(server), stdout=server.log, stderr=subprocess.STDOUT
            )
            ready_at = moved_at = None
            while time.monotonic() - restarted < 120:
                now = time.monotonic()
                if ready_at is None and ready(server.base):
                    ready_at = now
                if moved_at is None and (
                    any_finished(db, waiting) if waiting else finished_count(db) > done_before
                ):
                    moved_at = now
                    cpus.append(tree_cpu(server.proc.pid))
                if ready_at is not None and moved_at is not None:
                    break
                if server.proc.poll() is not None:
                    print(f"serve exited with {server.proc.returncode}; see {server.data_dir}/server.log")
                    return 1
                time.sleep(0.02)
            if ready_at is None or moved_at is None:
                print(f"kill {kills}: no recovery within 120 s; see {server.data_dir}/server.log")
                return 1
            stalls.append(moved_at - restarted)
            readies.append(ready_at - restarted)
            print(
                f"kill {kills:2d}: {pending_at_kill[-1]:4d} unfinished at the kill; ready after "
                f"{readies[-1]:.2f} s, the queue moving after {stalls[-1]:.2f} s "
                f"({cpus[-1]:.1f} CPU s; load average {loadavg[-1]:.1f})",
                flush=True,
            )
    finally:
        load.stop()
    soak_seconds = time.monotonic() - started

    drain_started = time.monotonic()
    while time.monotonic() - drain_started < 300:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            left = conn.execute(
                "SELECT count(*) FROM executions WHERE status IN ('queued', 'running')"
            ).fetchone()[0]
        if not left:
            break
        time.sleep(0.5)
    server.stop()

    acknowledged = {eid for eid, _t in load.acknowledged}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        # Execution ids are stored as 12 bytes (flowyard.db.compact): their hex is the id.
        rows = {_hex(r[0]): (r[1], r[2]) for r in conn.execute("SELECT id, status, attempts FROM executions")}
        recorded: dict[str, int] = {}
        for eid, n in conn.execute(
            "SELECT execution_id, count(*) FROM logs WHERE message = 'soak' GROUP BY execution_id"
        ):
            recorded[_hex(eid)] = n
    missing = acknowledged - rows.keys()
    not_succeeded = {e for e in acknowledged & rows.keys() if rows[e][0] != "succeeded"}
    not_once = {e for e in acknowledged if recorded.get(e, 0) != 1}
    reruns = sum(1 for e in acknowledged & rows.keys() if rows[e][1] > 1)

    print()
    tree = (
        f"supervisor, {args.api_processes} API processes, engine, runners"
        if args.api_processes > 1
        else "one process with API and engine, runners"
    )
    print(
        f"{kills} SIGKILLs of the whole tree ({processes} processes in all: {tree}) in {soak_seconds:.0f} s; "
        f"--api-processes {args.api_processes}, {args.clients} clients offering {args.rate:g} webhooks/s"
    )
    print(
        f"load average at the kills: median {pct(loadavg, 50):.1f}, max {max(loadavg, default=0):.1f} "
        f"({os.cpu_count()} cores)"
    )
    print(
        f"stall (restart -> first execution acknowledged before the kill finishing): p50 {pct(stalls, 50):.2f} s, "
        f"p99 {pct(stalls, 99):.2f} s, max {max(stalls, default=float('nan')):.2f} s, "
        f"min {min(stalls, default=float('nan')):.2f} s"
    )
    print(
        f"CPU the new tree used until the queue moved (all its processes): p50 {pct(cpus, 50):.1f} s, "
        f"max {max(cpus, default=float('nan')):.1f} s"
    )
    print(
        f"restart -> /health/ready: p50 {pct(readies, 50):.2f} s, p99 {pct(readies, 99):.2f} s, "
        f"max {max(readies, default=float('nan')):.2f} s"
    )
    print(
        f"unfinished executions at the kills: median {pct([float(n) for n in pending_at_kill], 50):.0f}, "
        f"max {max(pending_at_kill, default=0)} (sampled up to 500)"
    )
    print(
        f"acknowledged (202): {len(acknowledged)}; requests cut off or refused: {load.errors}; "
        f"other answers: {load.other or 'none'}"
    )
    print(
        f"missing: {len(missing)}; not succeeded: {len(not_succeeded)}; not recorded exactly once: "
        f"{len(not_once)}; run again after a kill (attempts > 1): {reruns}"
    )
    lost = bool(missing or not_succeeded or not_once)
    print("nothing acknowledged was lost" if not lost else "LOST OR DUPLICATED WORK (see above)")
    server.finish(keep=args.keep or lost)
    return 1 if lost else 0


def server_env(server: Server) -> dict[str, str]:
    return {
        **os.environ,
        "FLOWYARD_DATA_DIR": str(server.data_dir),
        "FLOWYARD_PORT": str(server.port),
        "FLOWYARD_ADMIN_USERNAME": ADMIN[0],
        "FLOWYARD_ADMIN_PASSWORD": ADMIN[1],
        "FLOWYARD_LOG_LEVEL": "warning",
        **server.env_extra,
    }


if __name__ == "__main__":
    sys.exit(main())
