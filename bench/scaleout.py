"""PostgreSQL scale-out: `flowyard serve --no-engine` (API only) plus 1, then 2
`flowyard worker` processes on a throw-away PostgreSQL database.

Two modes, for each worker count:

- load: clients post the webhook flow of bench/webhooks.py (async `202`) for a
  while; prints accepted/s, completed executions/s, CPU per process kind,
  PostgreSQL commits/s and connections.
- drain: N executions are queued with no worker running, then the workers are
  started and drain them (isolates the worker side from acceptance).

Statements and commits per execution are counted in every flowyard process by a
SQLAlchemy event hook (a sitecustomize on PYTHONPATH that only this bench
installs), besides PostgreSQL's own counters (pg_stat_database).

    .venv/bin/python bench/scaleout.py [--workers 1,2] [--mode both] [--seconds 20]
        [--clients 32] [--drain 3000] [--runners 1] [--pgbouncer PORT]

Everything runs on this machine: API, workers, their runners, PostgreSQL and the
load generator share its cores, so the curve bends where they saturate them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psutil
from _common import Server, post_request, run_load, summary
from webhooks import FLOW

PG_ADMIN_DSN = os.environ.get("FLOWYARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
PAYLOAD = {"order": {"id": "A-1", "items": [{"price": 3}, {"price": 4}]}}

# Installed only in the processes this bench starts: counts what SQLAlchemy sends.
_HOOK = """
import atexit, json, os, threading, time
from collections import Counter

_counts = Counter()
_out = os.environ["FLOWYARD_BENCH_COUNT_DIR"]


def _install():
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    @event.listens_for(Engine, "before_cursor_execute")
    def _stmt(conn, cursor, statement, parameters, context, executemany):
        verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
        _counts["statements"] += 1
        _counts["stmt:" + verb] += 1
        if executemany:
            _counts["executemany"] += 1
            _counts["executemany_rows"] += len(parameters)

    @event.listens_for(Engine, "commit")
    def _commit(conn):
        _counts["commits"] += 1

    @event.listens_for(Engine, "rollback")
    def _rollback(conn):
        _counts["rollbacks"] += 1

    @event.listens_for(Pool, "checkout")
    def _checkout(dbapi_conn, record, proxy):
        _counts["checkouts"] += 1

    @event.listens_for(Pool, "connect")
    def _connect(dbapi_conn, record):
        _counts["connects"] += 1


def _dump():
    if _counts:
        path = os.path.join(_out, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(dict(_counts), f)
        os.replace(path + ".tmp", path)


def _loop():
    while True:
        time.sleep(0.25)
        _dump()


try:
    _install()
    threading.Thread(target=_loop, daemon=True).start()
    atexit.register(_dump)
except Exception:
    pass
"""


def _counts(directory: Path) -> dict[str, int]:
    total: dict[str, int] = {}
    for path in directory.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            for k, v in json.loads(path.read_text()).items():
                total[k] = total.get(k, 0) + int(v)
    return total


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


@dataclass
class Phase:
    """One throw-away database, the API and some workers on it."""

    workers: int
    runners: int
    pgbouncer: int | None
    name: str = field(default_factory=lambda: f"flowyard_bench_{uuid.uuid4().hex[:8]}")
    count_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="flowyard-count-")))
    worker_procs: list[psutil.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        asyncio.run(_admin(f'CREATE DATABASE "{self.name}"'))
        base = PG_ADMIN_DSN.rsplit("/", 1)[0]
        self.direct_dsn = f"{base}/{self.name}"
        direct = self.direct_dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
        if self.pgbouncer:
            host = base.split("@", 1)[0]
            url = f"{host}@127.0.0.1:{self.pgbouncer}/{self.name}".replace(
                "postgresql://", "postgresql+asyncpg://", 1
            )
            url += "?pgbouncer=true"
        else:
            url = direct
        hook = self.count_dir / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(_HOOK)
        self.env = {
            "FLOWYARD_DATABASE_URL": url,
            "FLOWYARD_NOTIFY_DATABASE_URL": direct,
            "FLOWYARD_RUNNERS": str(self.runners),
            "FLOWYARD_API_PROCESSES": "1",
            "FLOWYARD_BENCH_COUNT_DIR": str(self.count_dir),
            "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
        }
        self.api = Server(args=("--no-engine",), env_extra=self.env)
        self.api.start()

    def start_workers(self, n: int) -> None:
        exe = str(Path(sys.executable).with_name("flowyard"))
        env = {
            **os.environ,
            **self.env,
            "FLOWYARD_DATA_DIR": str(self.api.data_dir),
            "FLOWYARD_LOG_LEVEL": "warning",
        }
        for i in range(n):
            log = open(self.api.data_dir / f"worker-{len(self.worker_procs)}-{i}.log", "wb")  # noqa: SIM115
            self.worker_procs.append(
                psutil.Popen([exe, "worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
            )

    def stop_workers(self) -> None:
        for p in self.worker_procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        for p in self.worker_procs:
            with contextlib.suppress(psutil.Error, subprocess.TimeoutExpired):
                p.wait(timeout=60)
        self.worker_procs = []

    def worker_cpu(self) -> float:
        total = 0.0
        for root in self.worker_procs:
            with contextlib.suppress(psutil.Error):
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = p.cpu_times()
                        total += t.user + t.system
        return total

    def backend_pids(self) -> list[int]:
        rows = asyncio.run(
            _fetch(PG_ADMIN_DSN, "SELECT pid FROM pg_stat_activity WHERE datname = $1", self.name)
        )
        return [int(r[0]) for r in rows]

    def stats(self) -> dict[str, int]:
        """pg_stat_database of the phase's database, once settled: a backend reports its counts
        when it has been idle for PostgreSQL's 10 s stats interval (or on exit), so read
        after that long without traffic."""
        time.sleep(11)
        rows = asyncio.run(
            _fetch(
                PG_ADMIN_DSN,
                "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, numbackends "
                "FROM pg_stat_database WHERE datname = $1",
                self.name,
            )
        )
        r = rows[0]
        return {
            "commits": int(r[0]),
            "rollbacks": int(r[1]),
            "inserted": int(r[2]),
            "updated": int(r[3]),
            "deleted": int(r[4]),
        }

    def statuses(self, flow_id: str) -> list[Any]:
        return asyncio.run(
            _fetch(
                self.direct_dsn,
                "SELECT status, created_at, started_at, finished_at FROM executions WHERE flow_id = $1",
                flow_id,
            )
        )

    def left(self) -> int:
        rows = asyncio.run(
            _fetch(self.direct_dsn, "SELECT count(*) FROM executions WHERE status IN ('queued', 'running')")
        )
        return int(rows[0][0])

    def active_flow(self) -> tuple[str, dict[str, str]]:
        headers = self.api.login()
        flow = httpx.post(f"{self.api.base}/flows", json=FLOW, headers=headers).json()["data"]
        httpx.post(f"{self.api.base}/flows/{flow['id']}/start", headers=headers).raise_for_status()
        deadline = time.monotonic() + 120
        while (
            httpx.get(f"{self.api.base}/flows/{flow['id']}", headers=headers).json()["data"]["status"]
            != "active"
        ):
            if time.monotonic() > deadline:
                raise SystemExit("the flow did not become active")
            time.sleep(0.1)
        return str(flow["id"]), headers

    def wait_drained(self, limit: float = 600) -> None:
        deadline = time.monotonic() + limit
        while self.left() and time.monotonic() < deadline:
            time.sleep(0.5)

    def close(self) -> None:
        self.stop_workers()
        self.api.finish()
        shutil.rmtree(self.count_dir, ignore_errors=True)
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))


class Sampler:
    """Connections to the phase's database (pg_stat_activity), sampled while the load runs."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.peak = 0
        self.peak_active = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        sql = (
            "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()"
        )

        async def loop() -> None:
            conn = await asyncpg.connect(PG_ADMIN_DSN)
            try:
                while not self._stop.is_set():
                    row = await conn.fetchrow(sql, self.phase.name)
                    self.peak = max(self.peak, int(row[0]))
                    self.peak_active = max(self.peak_active, int(row[1]))
                    await asyncio.sleep(0.5)
            finally:
                await conn.close()

        asyncio.run(loop())


def _pg_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _per(n: int, d: dict[str, int], keys: list[str]) -> str:
    return ", ".join(f"{k} {d.get(k, 0) / max(n, 1):.2f}" for k in keys)


def run_load_phase(workers: int, args: argparse.Namespace) -> dict[str, float]:
    phase = Phase(workers, args.runners, args.pgbouncer)
    try:
        phase.start_workers(workers)
        fid, _headers = phase.active_flow()
        time.sleep(2)  # runners up
        stats0 = phase.stats()
        count0 = _counts(phase.count_dir)
        api0, wk0, me0 = phase.api.cpu(), phase.worker_cpu(), _self_cpu()
        pids = phase.backend_pids()
        pg0 = _pg_cpu(pids)
        started = time.time()
        with Sampler(phase) as sampler:
            load = run_load(
                phase.api.port,
                post_request(f"/webhooks/{fid}", lambda i: PAYLOAD),
                clients=args.clients,
                seconds=args.seconds,
                expect=202,
                keep_bodies=True,
            )
        ended = time.time()
        pids = sorted(set(pids) | set(phase.backend_pids()))
        api_cpu, wk_cpu, me_cpu = phase.api.cpu() - api0, phase.worker_cpu() - wk0, _self_cpu() - me0
        pg_cpu = _pg_cpu(pids) - pg0
        phase.wait_drained()
        drained = time.time()
        rows = phase.statuses(fid)
        count2 = _counts(phase.count_dir)
        stats2 = phase.stats()
    finally:
        phase.close()
    accepted = {orjson.loads(b)["data"]["executionId"] for b in load.responses}
    done = [r for r in rows if r[0] == "succeeded"]
    in_window = [r for r in done if r[3].timestamp() <= ended]
    window = ended - started
    total_sent = _delta(count2, count0)
    total_pg = _delta(stats2, stats0)
    print(f"\n== load: API (serve --no-engine) + {workers} worker(s), {args.runners} runner(s) each ==")
    print(
        f"accepted {load.ok} ({load.rate:.0f}/s), other answers {load.errors or 'none'}; {summary(load.latencies)}"
    )
    print(
        f"completed during the load: {len(in_window)} ({len(in_window) / window:.0f}/s); "
        f"all {len(done)} of {len(rows)} stored completed: {'yes' if len(done) == len(rows) >= len(accepted) else 'NO'}"
    )
    print(
        f"CPU s during the load: API {api_cpu:.1f}, workers+runners {wk_cpu:.1f}, PostgreSQL backends "
        f"{pg_cpu:.1f}, load generator {me_cpu:.1f} (of {window * (os.cpu_count() or 1):.0f} available)"
    )
    n = max(load.ok, 1)
    print(
        f"CPU ms per accepted webhook: API {api_cpu / n * 1000:.2f}, workers {wk_cpu / n * 1000:.2f}, "
        f"PostgreSQL {pg_cpu / n * 1000:.2f}"
    )
    print(
        f"PostgreSQL from the load's start until drained ({drained - started:.1f} s): "
        f"{total_pg.get('commits', 0) / (drained - started):.0f} commits/s, "
        f"{total_pg.get('rollbacks', 0) / (drained - started):.0f} rollbacks/s; "
        f"connections peak {sampler.peak} (active at once {sampler.peak_active})"
    )
    ex = max(len(done), 1)
    print(
        "until drained, per execution: PostgreSQL "
        + _per(ex, total_pg, ["commits", "rollbacks", "inserted", "updated", "deleted"])
    )
    verbs = sorted(k for k in total_sent if k.startswith("stmt:"))
    print(
        "until drained, per execution, sent by SQLAlchemy: "
        + _per(
            ex, total_sent, ["statements", "commits", "rollbacks", "checkouts", "executemany_rows", *verbs]
        )
    )
    return {"accepted": load.rate, "completed": len(in_window) / window}


def run_drain_phase(workers: int, args: argparse.Namespace) -> float:
    phase = Phase(workers, args.runners, args.pgbouncer)
    try:
        # A worker activates the flow, then leaves: the queue fills with nobody claiming.
        phase.start_workers(1)
        fid, _headers = phase.active_flow()
        phase.stop_workers()
        queued = _enqueue(phase, fid, args.drain)
        stats0 = phase.stats()
        count0 = _counts(phase.count_dir)
        started = time.monotonic()
        phase.start_workers(workers)
        cpu0 = None
        with Sampler(phase) as sampler:
            while left := phase.left():
                if cpu0 is None and left < queued:
                    cpu0, left0 = phase.worker_cpu(), left  # claiming started: the workers are up
                if time.monotonic() - started > 900:
                    break
                time.sleep(0.2)
        wall = time.monotonic() - started
        wk_cpu = phase.worker_cpu() - (cpu0 or 0.0)
        measured = left0 if cpu0 is not None else queued
        rows = phase.statuses(fid)
        count1 = _counts(phase.count_dir)
        stats1 = phase.stats()
    finally:
        phase.close()
    done = sorted((r for r in rows if r[0] == "succeeded"), key=lambda r: r[3])
    first, last = done[0][3].timestamp(), done[-1][3].timestamp()
    rate = (len(done) - 1) / (last - first) if last > first else float("nan")
    pg = _delta(stats1, stats0)
    sent = _delta(count1, count0)
    print(f"\n== drain: {queued} queued executions, {workers} worker(s), {args.runners} runner(s) each ==")
    print(
        f"completed {len(done)} of {len(rows)}: {rate:.0f}/s from first to last completion "
        f"({wall:.1f} s wall including worker start)"
    )
    print(
        f"workers+runners CPU {wk_cpu:.1f} s after their start ({wk_cpu / max(measured, 1) * 1000:.2f} ms "
        "per execution); "
        f"PostgreSQL {pg.get('commits', 0) / wall:.0f} commits/s over the wall time; connections peak {sampler.peak}"
    )
    ex = max(len(done), 1)
    print(
        "per execution: PostgreSQL "
        + _per(ex, pg, ["commits", "rollbacks", "inserted", "updated", "deleted"])
    )
    verbs = sorted(k for k in sent if k.startswith("stmt:"))
    print(
        "per execution, sent by SQLAlchemy: "
        + _per(ex, sent, ["statements", "commits", "rollbacks", "checkouts", "executemany_rows", *verbs])
    )
    return rate


def _enqueue(phase: Phase, fid: str, n: int) -> int:
    """``n`` webhooks accepted (202) while no worker runs."""
    ok = 0
    while ok < n:
        load = run_load(
            phase.api.port,
            post_request(f"/webhooks/{fid}", lambda i: PAYLOAD),
            clients=16,
            seconds=2,
            expect=202,
        )
        ok += load.ok
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2", help="Worker counts to run, comma-separated.")
    parser.add_argument("--mode", choices=("load", "drain", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--drain", type=int, default=3000, help="Executions queued for the drain mode.")
    parser.add_argument("--runners", type=int, default=1, help="FLOWYARD_RUNNERS of each worker.")
    parser.add_argument(
        "--pgbouncer",
        type=int,
        default=None,
        metavar="PORT",
        help="Send the API's and workers' queries through a PgBouncer (transaction mode) listening on "
        "127.0.0.1:PORT in front of the same server; LISTEN stays direct.",
    )
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    print(
        f"PostgreSQL {PG_ADMIN_DSN.rsplit('@', 1)[-1]}, {os.cpu_count()} cores shared by the API, the "
        "workers and their runners, PostgreSQL and this load generator"
    )
    curve: list[tuple[int, float, float, float]] = []
    for w in counts:
        load = (
            run_load_phase(w, args) if args.mode in ("load", "both") else {"accepted": 0.0, "completed": 0.0}
        )
        drain = run_drain_phase(w, args) if args.mode in ("drain", "both") else 0.0
        curve.append((w, load["accepted"], load["completed"], drain))
    print("\nworkers | accepted/s | completed/s under load | drained/s")
    for w, a, c, d in curve:
        print(f"{w:7d} | {a:10.0f} | {c:22.0f} | {d:9.0f}")


if __name__ == "__main__":
    main()
