"""Stopping and crashing real processes: SIGTERM drains (`/health/ready` answers 503 with
Retry-After, running executions finish, what is left goes back to the queue at once, exit 0),
a second SIGTERM exits at once, and the work of a SIGKILLed process runs again within
seconds (heartbeats), long before its 30 s lease would expire. Nothing is lost and no
execution's outcome, steps or logs are recorded twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.queue.models import Execution
from tests.conftest import flow_body
from tests.engine.test_processes import Cluster, _active_flow, _empty, _login, _query, summaries_of
from tests.engine.test_serve_processes import _children

pytestmark = [pytest.mark.slow]
FINAL = ("succeeded", "failed", "cancelled")


def _delay_flow(seconds: float, name: str = "slow") -> dict[str, Any]:
    return flow_body(
        name=name,
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "slow", "componentId": "delay", "fields": {"seconds": seconds}},
            ],
            "edges": [{"source": "in", "target": "slow"}],
        },
    )


def _post(c: Cluster, fid: str, n: int) -> list[str]:
    ids = []
    with httpx.Client(base_url=c.base) as client:
        for i in range(n):
            r = client.post(f"/webhooks/{fid}", json={"i": i})
            assert r.status_code == 202, r.text
            ids.append(r.json()["data"]["executionId"])
    return ids


def _held_by(url: str, pid: int) -> set[str]:
    rows = _query(
        url,
        sa.select(Execution.id).where(
            Execution.status == "running", Execution.lease_owner.like(f"%:{pid}:%")
        ),
    )
    return {r[0] for r in rows}


def _wait_held(url: str, pid: int, at_least: int = 1, within: float = 30) -> set[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        held = _held_by(url, pid)
        if len(held) >= at_least:
            return held
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never held {at_least} executions")


def _states(url: str) -> dict[str, tuple[str, str | None, int]]:
    rows = _query(url, sa.select(Execution.id, Execution.status, Execution.lease_owner, Execution.attempts))
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def _wait_final(url: str, ids: list[str], within: float = 60) -> dict[str, tuple[str, str | None, int]]:
    deadline = time.monotonic() + within
    states: dict[str, tuple[str, str | None, int]] = {}
    while time.monotonic() < deadline:
        states = _states(url)
        if all(states.get(i, ("",))[0] in FINAL for i in ids):
            return states
        time.sleep(0.1)
    raise AssertionError(
        f"not finished: {[(i, states.get(i)) for i in ids if states.get(i, ('',))[0] not in FINAL]}"
    )


def _recorded_once(url: str, ids: list[str]) -> None:
    """Every execution has its one execution row, one result for the step in its step
    document (written with its final status) and one summary log entry."""
    docs = dict(_query(url, sa.select(Execution.id, Execution.steps).where(Execution.id.in_(ids))))
    steps = {i: sum(1 for s in docs.get(i) or [] if s["nodeId"] == "slow") for i in ids}
    logs = dict(summaries_of(url))
    assert {i: steps.get(i) for i in ids} == dict.fromkeys(ids, 1)
    assert {i: logs.get(i) for i in ids} == dict.fromkeys(ids, 1)


def _taken_over_within(url: str, ids: set[str], pid: int, within: float) -> None:
    """Each of ``ids`` is held by another process or finished, within ``within`` seconds
    (the time it took is printed: docs/operations.md quotes it)."""
    started = time.monotonic()
    deadline = started + within
    while True:
        states = _states(url)
        left = {i for i in ids if states[i][0] == "queued" or f":{pid}:" in (states[i][1] or "")}
        if not left:
            print(f"taken over {time.monotonic() - started:.2f} s after the kill or exit")
            return
        assert time.monotonic() < deadline, (
            f"still waiting for another process: {[(i, states[i]) for i in left]}"
        )
        time.sleep(0.05)


@pytest.fixture
def pg(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """The API on PostgreSQL; workers started by each test. Leases of 30 s: only heartbeats
    or a drained stop can hand work back in the times these tests allow."""
    asyncio.run(_empty(postgres_url))
    c = Cluster(postgres_url, tmp_path)
    c.env["FLOWYARD_LEASE_SECONDS"] = "30"
    c.start("api", "serve", "--no-engine")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


def _wait_worker_ready(c: Cluster, url: str, proc: subprocess.Popen[bytes], name: str) -> None:
    """A worker is ready to claim once its heartbeat row is written (after its runners start)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, c.log(name)
        if _query(url, sa.text(f"SELECT 1 FROM process_heartbeats WHERE pid = {proc.pid}")):
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} never beat: {c.log(name)}")


def _engine_pid(supervisor: int) -> int:
    (pid,) = [pid for pid, cmd in _children(supervisor).items() if "flowyard.cli worker" in cmd]
    return pid


def _two_workers(
    c: Cluster, url: str, grace: tuple[str, str] = ("5", "5")
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    c.env["FLOWYARD_STOP_GRACE_SECONDS"] = grace[0]
    a = c.start("worker-a", "worker")
    c.env["FLOWYARD_STOP_GRACE_SECONDS"] = grace[1]
    b = c.start("worker-b", "worker")
    _wait_worker_ready(c, url, a, "worker-a")
    _wait_worker_ready(c, url, b, "worker-b")
    return a, b


def test_sigkilled_pg_worker_work_runs_again_within_seconds(pg: Cluster, postgres_url: str) -> None:
    c = pg
    # All 20 on the victim (one owner's flow: past the default per-tenant cap of 16 here).
    c.env["FLOWYARD_MAX_RUNNING_PER_TENANT"] = "0"
    victim, survivor = _two_workers(c, postgres_url)
    fid = _active_flow(c, _login(c), _delay_flow(3.0))
    survivor.send_signal(signal.SIGSTOP)  # so that the victim claims the work
    try:
        accepted = _post(c, fid, 20)
        _wait_held(postgres_url, victim.pid, at_least=20)
    finally:
        survivor.send_signal(signal.SIGCONT)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    orphaned = _held_by(postgres_url, victim.pid)
    assert orphaned, "the kill landed while worker A held executions"
    # Heartbeat timeout 3 s + a beat: far below the 30 s lease.
    _taken_over_within(postgres_url, orphaned, victim.pid, within=5)
    states = _wait_final(postgres_url, accepted)
    assert {states[i][0] for i in accepted} == {"succeeded"}, c.log("worker-b")
    assert {states[i][2] for i in orphaned} == {2}, "what A held ran again, counted as a re-run"
    _recorded_once(postgres_url, accepted)
    assert _query(postgres_url, sa.text(f"SELECT 1 FROM process_heartbeats WHERE pid = {victim.pid}")) == []


def test_sigterm_pg_worker_finishes_running_hands_back_the_rest_exits_0(
    pg: Cluster, postgres_url: str
) -> None:
    c = pg
    a, b = _two_workers(c, postgres_url, grace=("6", "60"))
    headers = _login(c)
    short = _active_flow(c, headers, _delay_flow(2, "short"))
    long = _active_flow(c, headers, _delay_flow(12, "long"))
    b.send_signal(signal.SIGSTOP)  # so that A claims everything
    try:
        shorts = _post(c, short, 4)
        longs = _post(c, long, 4)
        held = _wait_held(postgres_url, a.pid, at_least=8)
    finally:
        b.send_signal(signal.SIGCONT)
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=30) == 0, c.log("worker-a")
    # The long ones ran past the grace and went back at once: B holds them right away.
    _taken_over_within(postgres_url, set(longs), a.pid, within=1)
    states = _states(postgres_url)
    # The short ones finished on A, once; the long ones are re-runs.
    assert held == set(shorts + longs)
    assert {states[i][:3] for i in shorts} == {("succeeded", None, 1)}
    assert {states[i][2] for i in longs} == {2}
    assert "Traceback" not in c.log("worker-a"), c.log("worker-a")
    assert _query(postgres_url, sa.text(f"SELECT 1 FROM process_heartbeats WHERE pid = {a.pid}")) == []
    # A second SIGTERM: B stops at once (its grace is 60 s, the delay 12 s), handing back.
    b.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=10) == 0, c.log("worker-b")
    states = _states(postgres_url)
    assert {states[i][:2] for i in longs} == {("queued", None)}, "handed back, not left to the lease"
    _recorded_once(postgres_url, shorts)


@pytest.mark.parametrize("api_processes", ["1", "2"])
def test_sigterm_sqlite_serve_drains_and_exits_0(tmp_path: Path, api_processes: str) -> None:
    url = f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"
    c = Cluster(url, tmp_path)
    c.env.update(
        {
            "FLOWYARD_LEASE_SECONDS": "30",
            "FLOWYARD_STOP_GRACE_SECONDS": "20",
            "FLOWYARD_DRAIN_SECONDS": "3",
            "FLOWYARD_WORKER_CONCURRENCY": "2",
        }
    )
    serve = c.start("serve", "serve", "--api-processes", api_processes)
    try:
        c.wait_ready()
        fid = _active_flow(c, _login(c), _delay_flow(2.5))
        accepted = _post(c, fid, 5)
        running = _wait_held(url, _engine_pid(serve.pid) if api_processes == "2" else serve.pid)
        serve.send_signal(signal.SIGTERM)
        # Draining: the API still answers, readiness says 503 with Retry-After.
        deadline = time.monotonic() + 10
        seen = None
        while time.monotonic() < deadline and serve.poll() is None:
            try:
                r = httpx.get(f"{c.base}/health/ready", timeout=1)
            except httpx.HTTPError:
                break
            if r.status_code == 503:
                seen = r
                break
            time.sleep(0.05)
        assert seen is not None, c.log("serve")
        assert int(seen.headers["Retry-After"]) > 0 and seen.json()["status"] == "draining"
        assert httpx.get(f"{c.base}/health", timeout=1).status_code == 200  # alive all along
        assert serve.wait(timeout=40) == 0, c.log("serve")
        states = _states(url)
        assert {states[i][:2] for i in running} == {("succeeded", None)}, "running ones finished"
        left = [i for i in accepted if states[i][0] != "succeeded"]
        assert {states[i][:2] for i in left} <= {("queued", None)}
    finally:
        c.stop_all()
    # The next process on the database runs what was left, once.
    c.procs.clear()
    c.start("serve-2", "serve")
    try:
        c.wait_ready()
        states = _wait_final(url, accepted)
        assert {states[i][0] for i in accepted} == {"succeeded"}
        assert {states[i][2] for i in accepted} == {1}, "nothing ran twice"
        _recorded_once(url, accepted)
    finally:
        c.stop_all()


def test_sigkilled_sqlite_engine_work_runs_again_within_seconds(tmp_path: Path) -> None:
    """`serve` with a supervisor on SQLite: the engine process is SIGKILLed; the one the
    supervisor starts in its place takes back its work as it starts (same host, pid gone)."""
    url = f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"
    c = Cluster(url, tmp_path)
    c.env["FLOWYARD_LEASE_SECONDS"] = "30"
    serve = c.start("serve", "serve", "--api-processes", "2")
    try:
        c.wait_ready()
        fid = _active_flow(c, _login(c), _delay_flow(1.0))
        accepted = _post(c, fid, 10)
        engine = _engine_pid(serve.pid)
        _wait_held(url, engine)
        os.kill(engine, signal.SIGKILL)
        orphaned = _held_by(url, engine)
        assert orphaned
        # The restarted engine (0.5 s back-off, then its runners start) takes them back.
        _taken_over_within(url, orphaned, engine, within=15)
        states = _wait_final(url, accepted)
        assert {states[i][0] for i in accepted} == {"succeeded"}, c.log("serve")
        assert {states[i][2] for i in orphaned} == {2}
        _recorded_once(url, accepted)
    finally:
        c.stop_all()
    assert serve.returncode == 0, c.log("serve")


def test_second_sigterm_stops_sqlite_serve_at_once_handing_back(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"
    c = Cluster(url, tmp_path)
    c.env.update({"FLOWYARD_LEASE_SECONDS": "30", "FLOWYARD_STOP_GRACE_SECONDS": "60"})
    serve = c.start("serve", "serve")
    try:
        c.wait_ready()
        fid = _active_flow(c, _login(c), _delay_flow(40))
        accepted = _post(c, fid, 3)
        _wait_held(url, serve.pid, at_least=3)
        serve.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=15) == 0, c.log("serve")  # its grace is 60 s, the delay 40 s
        states = _states(url)
        assert {states[i][:2] for i in accepted} == {("queued", None)}, "handed back, not left to the lease"
    finally:
        c.stop_all()
