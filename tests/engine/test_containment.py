"""Hostile flows against real processes: a runaway JSONata expression and a memory
bomb, each started by one anonymous webhook, while another flow keeps receiving
webhooks. Every execution of the well-behaved flow completes, ``/health`` keeps
answering within 100 ms (p99), each poison execution fails alone with its limit
named, and SIGTERM still stops the service within its grace period.

On SQLite with ``flowyard serve``; on PostgreSQL with ``flowyard serve --no-engine``
and a separate ``flowyard worker``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import sqlalchemy as sa

from flowyard.logs.models import LogEntry
from flowyard.queue.models import Execution
from tests.conftest import flow_body
from tests.engine.test_observability_processes import samples, value
from tests.engine.test_processes import Cluster, _active_flow, _empty, _free_port, _login, _query

pytestmark = [pytest.mark.slow]

RUNAWAY = "($f := function($n){$f($n+1)}; $f(0))"
BOMB = "[1..10000].[1..10000]"
LIMITS = {
    "FLOWYARD_RUNNERS": "2",
    "FLOWYARD_RUNNER_SURGE": "2",
    "FLOWYARD_EXECUTION_CPU_SECONDS": "1.5",
    "FLOWYARD_RUNNER_MEMORY_MB": "256",
    "FLOWYARD_STOP_GRACE_SECONDS": "5",
}
GRACE = 5.0


def _jsonata_flow(name: str, expression: str) -> dict[str, Any]:
    return flow_body(
        name=name,
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "calc", "componentId": "jsonata", "fields": {"expression": expression}},
                {"id": "out", "componentId": "log"},
            ],
            "edges": [{"source": "in", "target": "calc"}, {"source": "calc", "target": "out"}],
        },
    )


# Sampled from a process of its own, so the test's own work (queries, webhooks) cannot
# delay a probe behind this process's GIL and be mistaken for the service's latency.
_SAMPLER = """
import sys, threading, time, json, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
latencies = []
with httpx.Client(base_url=sys.argv[1], timeout=1.0) as client:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            ok = client.get("/health").status_code == 200
        except httpx.HTTPError:
            ok = False
        latencies.append(time.perf_counter() - started if ok else 1.0)
        stop.wait(0.02)
print(json.dumps(latencies))
"""


class HealthSampler:
    """GET /health every 20 ms until stopped; a failed or timed-out probe counts as 1 s."""

    def __init__(self, base: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, base], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.latencies: list[float] = []

    def stop(self) -> None:
        out, _ = self.proc.communicate(b"", timeout=10)
        self.latencies = json.loads(out)

    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98]

    def close(self) -> None:
        if self.proc.poll() is None:  # the test failed before stop()
            self.proc.kill()
            self.proc.wait()


def _finished(url: str, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    rows = _query(
        url, sa.select(Execution.id, Execution.status, Execution.error).where(Execution.id.in_(ids))
    )
    return {r[0]: (r[1], r[2]) for r in rows if r[1] in ("succeeded", "failed", "cancelled")}


def _hostile_flows_are_contained(c: Cluster, db_url: str, engine: str, metrics_url: str) -> None:
    headers = _login(c)
    good = _active_flow(c, headers, _jsonata_flow("good", "{'n': n * 2}"))
    runaway = _active_flow(c, headers, _jsonata_flow("runaway", RUNAWAY))
    bomb = _active_flow(c, headers, _jsonata_flow("bomb", BOMB))
    accepted: list[str] = []
    with (
        contextlib.closing(HealthSampler(c.base)) as sampler,
        httpx.Client(base_url=c.base) as anonymous,  # webhooks need no token
    ):

        def hook(fid: str, body: dict[str, Any]) -> str:
            r = anonymous.post(f"/webhooks/{fid}", json=body)
            assert r.status_code == 202, r.text
            return str(r.json()["data"]["executionId"])

        poison = {"cpu": hook(runaway, {}), "memory": hook(bomb, {})}
        for i in range(80):
            accepted.append(hook(good, {"n": i}))
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        done: dict[str, tuple[str, str | None]] = {}
        while time.monotonic() < deadline:
            done = _finished(db_url, [*accepted, *poison.values()])
            if len(done) == len(accepted) + 2:
                break
            time.sleep(0.5)
        sampler.stop()
        assert len(done) == len(accepted) + 2, (
            f"unfinished: {len(accepted) + 2 - len(done)}\n{c.log(engine)[-3000:]}"
        )
        assert {done[e][0] for e in accepted} == {"succeeded"}, c.log(engine)[-3000:]
        assert done[poison["cpu"]] == ("failed", "step calc exceeded the 1.5 s CPU limit")
        assert done[poison["memory"]] == ("failed", "step calc exceeded the 256 MiB memory limit")
        errors = _query(
            db_url,
            sa.select(LogEntry.execution_id, LogEntry.step_id, LogEntry.component_id, LogEntry.message).where(
                LogEntry.level == "error", LogEntry.flow_id.in_((runaway, bomb))
            ),
        )
        assert sorted(errors) == sorted(
            [
                (
                    poison["cpu"],
                    "calc",
                    "jsonata",
                    "step calc exceeded the 1.5 s CPU limit; its runner process was killed and replaced",
                ),
                (
                    poison["memory"],
                    "calc",
                    "jsonata",
                    "step calc exceeded the 256 MiB memory limit; its runner process was killed and replaced",
                ),
            ]
        )
        attempts = _query(db_url, sa.select(Execution.attempts).where(Execution.id.in_(poison.values())))
        assert [a for (a,) in attempts] == [1, 1], "a poison execution is never handed out again"
        kills = samples(httpx.get(metrics_url).text)
        assert value(kills, "flowyard_runner_kills_total", reason="cpu") == 1
        # 2 when the bomb had company when it first killed its runner: then every execution
        # aboard is a suspect and runs again alone, and the bomb kills a runner once more.
        assert value(kills, "flowyard_runner_kills_total", reason="memory") in (1, 2)
        assert value(kills, "flowyard_runner_kills_total", reason="crash") == 0
        print(f"/health: {len(sampler.latencies)} probes, p99 {sampler.p99() * 1000:.1f} ms")
        assert len(sampler.latencies) > 100
        assert sampler.p99() < 0.100, f"/health p99 {sampler.p99() * 1000:.0f} ms"

        # SIGTERM while a runaway holds a runner: the engine still stops within its grace.
        proc = c.procs[engine]
        runners = psutil.Process(proc.pid).children()
        # The two base runners, and the surge runners placement started while a poison ran
        # alone (they stay up until idle for FLOWYARD_RUNNER_SURGE_IDLE_SECONDS): all must end.
        assert 2 <= len(runners) <= 2 + 2, runners
        hook(runaway, {"again": True})
        time.sleep(0.3)
    for p in c.procs.values():
        p.send_signal(signal.SIGTERM)
    started = time.monotonic()
    for p in c.procs.values():
        p.wait(timeout=GRACE + 10)
    assert time.monotonic() - started < GRACE + 2, "stopped within the grace period"
    _gone, alive = psutil.wait_procs(runners, timeout=2)
    assert not alive, "runner processes end with their engine"
    assert "Traceback" not in c.log(engine), c.log(engine)


def test_hostile_flows_on_sqlite_serve(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'flowyard.db'}"
    c = Cluster(url, tmp_path)
    c.env.update(LIMITS)
    c.start("serve", "serve")
    try:
        c.wait_ready()
        _hostile_flows_are_contained(c, url, "serve", f"{c.base}/metrics")
    finally:
        c.stop_all()


def test_hostile_flows_on_postgres_worker(postgres_url: str, tmp_path: Path) -> None:
    asyncio.run(_empty(postgres_url))
    c = Cluster(postgres_url, tmp_path)
    c.env.update(LIMITS)
    c.start("api", "serve", "--no-engine")
    try:
        c.wait_ready()
        port = _free_port()
        c.env["FLOWYARD_METRICS_PORT"] = str(port)
        c.start("worker", "worker")
        _hostile_flows_are_contained(c, postgres_url, "worker", f"http://127.0.0.1:{port}/metrics")
    finally:
        c.stop_all()
