"""Real processes on PostgreSQL: the API (`flowyard serve --no-engine`) and
several `flowyard worker` processes. A worker killed with SIGKILL mid-run loses
nothing; several schedulers fire each cron tick once."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.db.session import Database
from flowyard.logs.models import LogEntry
from flowyard.queue.models import Execution, FlowDayCount
from tests.conftest import flow_body, truncate

pytestmark = [pytest.mark.slow]
ADMIN = ("ops@example.com", "a long admin password")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self, db_url: str, tmp: Path) -> None:
        self.db_url = db_url
        self.tmp = tmp
        self.port = _free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            "FLOWYARD_DATABASE_URL": db_url,
            "FLOWYARD_DATA_DIR": str(tmp),
            "FLOWYARD_PORT": str(self.port),
            "FLOWYARD_ADMIN_USERNAME": ADMIN[0],
            "FLOWYARD_ADMIN_PASSWORD": ADMIN[1],
            "FLOWYARD_LEASE_SECONDS": "2",
            "FLOWYARD_POLL_INTERVAL": "0.1",
            # These tests hold executions running with delay steps: slept in the runner (held),
            # not parked as waiting (SPEC §11; test_failure_durability covers parking).
            "FLOWYARD_DELAY_PARK_SECONDS": "3600",
            "FLOWYARD_SCHEDULER_INTERVAL": "0.2",
            "FLOWYARD_STOP_GRACE_SECONDS": "5",
            "FLOWYARD_LOG_LEVEL": "warning",
            # One runner per worker: three workers with a runner per core start slowly on a busy
            # 2-core machine, and the lifecycle waits for a ready runner before activating flows.
            "FLOWYARD_RUNNERS": "1",
            # One process per `serve`, whatever the machine's cores: these tests look at the
            # engine's own children (test_serve_processes covers the multi-process serve).
            "FLOWYARD_API_PROCESSES": "1",
        }
        self.base = f"http://127.0.0.1:{self.port}"

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        exe = str(Path(sys.executable).with_name("flowyard"))
        out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([exe, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def wait_ready(self) -> None:
        deadline = (
            time.monotonic() + 60
        )  # a liveness bound: a first start migrates, and the machine is shared
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited: {(self.tmp / f'{name}.log').read_text()}")
            time.sleep(0.1)
        raise AssertionError("API did not become ready")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    asyncio.run(_empty(postgres_url))  # the API process then creates the administrator
    c = Cluster(postgres_url, tmp_path)
    c.start("api", "serve", "--no-engine")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


def _login(c: Cluster) -> dict[str, str]:
    r = httpx.post(f"{c.base}/login", json={"username": ADMIN[0], "password": ADMIN[1]})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _active_flow(c: Cluster, headers: dict[str, str], body: dict[str, Any]) -> str:
    fid = httpx.post(f"{c.base}/flows", json=body, headers=headers).json()["data"]["id"]
    assert httpx.post(f"{c.base}/flows/{fid}/start", headers=headers).status_code == 200
    deadline = time.monotonic() + 60  # a liveness bound, generous for a loaded machine
    while time.monotonic() < deadline:
        if httpx.get(f"{c.base}/flows/{fid}", headers=headers).json()["data"]["status"] == "active":
            return fid
        time.sleep(0.1)
    raise AssertionError("flow did not become active")


async def _empty(url: str) -> None:
    db = Database(url)
    try:
        await truncate(db)
    finally:
        await db.dispose()


def _query(url: str, stmt: Any) -> list[Any]:
    async def run() -> list[Any]:
        db = Database(url)
        try:
            async with db.read() as session:
                return list((await session.execute(stmt)).all())
        finally:
            await db.dispose()

    return asyncio.run(run())


def summaries_of(url: str) -> list[tuple[str, int]]:
    """(execution, how many) of the ``slow`` step's entries that tell of it (``step slow ...``),
    counted here: a message is stored packed on SQLite (db/packed.py), so SQL cannot match it."""
    rows = _query(url, sa.select(LogEntry.execution_id, LogEntry.message).where(LogEntry.step_id == "slow"))
    counts = Counter(eid for eid, message in rows if message.startswith("step slow"))
    return sorted(counts.items())


def test_sigkilled_worker_loses_nothing(cluster: Cluster, postgres_url: str) -> None:
    c = cluster
    victim = c.start("worker-a", "worker")
    c.start("worker-b", "worker")
    headers = _login(c)
    fid = _active_flow(
        c,
        headers,
        flow_body(
            graph={
                "nodes": [
                    {"id": "in", "componentId": "webhook"},
                    {"id": "slow", "componentId": "delay", "fields": {"seconds": 0.6}},
                ],
                "edges": [{"source": "in", "target": "slow"}],
            }
        ),
    )
    accepted = []
    with httpx.Client(base_url=c.base) as client:
        for i in range(60):
            r = client.post(f"/webhooks/{fid}", json={"i": i})
            assert r.status_code == 202, r.text
            accepted.append(r.json()["data"]["executionId"])
    # Kill worker A while it holds executions mid-run.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        held = _query(
            postgres_url,
            sa.select(Execution.id).where(
                Execution.status == "running", Execution.lease_owner.like(f"%:{victim.pid}:%")
            ),
        )
        if held:
            break
        time.sleep(0.05)
    assert held, "worker A never claimed anything"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # What A still held when it died (it may have finished some of `held` just before).
    orphaned = _query(
        postgres_url,
        sa.select(Execution.id).where(
            Execution.status == "running", Execution.lease_owner.like(f"%:{victim.pid}:%")
        ),
    )
    assert orphaned, "the kill landed while worker A held executions"

    deadline = time.monotonic() + 60
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = _query(postgres_url, sa.select(Execution.id, Execution.status, Execution.attempts))
        if all(r[1] in ("succeeded", "failed", "cancelled") for r in rows):
            break
        time.sleep(0.2)
    by_id = {r[0]: r for r in rows}
    assert sorted(by_id) == sorted(accepted), "every accepted webhook has exactly one execution record"
    assert {r[1] for r in rows} == {"succeeded"}, c.log("worker-b")
    rerun = [r for r in rows if r[2] > 1]
    assert {r[0] for r in orphaned} <= {r[0] for r in rerun}, "what A held when it died ran again on B"
    # Completion is recorded once per execution: one summary entry for the delay step each.
    summaries = summaries_of(postgres_url)
    assert len(summaries) == len(accepted) and {n for _e, n in summaries} == {1}


def test_many_schedulers_fire_each_tick_once(cluster: Cluster, postgres_url: str) -> None:
    c = cluster
    for name in ("worker-a", "worker-b", "worker-c"):
        c.start(name, "worker")
    headers = _login(c)
    fid = _active_flow(c, headers, flow_body(cron="* * * * * *"))
    time.sleep(4.5)
    assert httpx.post(f"{c.base}/flows/{fid}/stop", headers=headers).status_code == 200
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if httpx.get(f"{c.base}/flows/{fid}", headers=headers).json()["data"]["status"] == "inactive":
            break
        time.sleep(0.1)
    ticks = sorted(
        r[0] for r in _query(postgres_url, sa.select(Execution.scheduled_for).where(Execution.flow_id == fid))
    )
    assert len(ticks) >= 3
    seconds = [int(t.timestamp()) for t in ticks]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), (
        "one execution per tick, none missed"
    )
    counted = _query(
        postgres_url, sa.select(sa.func.sum(FlowDayCount.executions)).where(FlowDayCount.flow_id == fid)
    )
    assert counted[0][0] == len(ticks), "a tick another scheduler won is not counted twice"
    for name in ("worker-a", "worker-b", "worker-c"):
        assert "Traceback" not in c.log(name), c.log(name)
