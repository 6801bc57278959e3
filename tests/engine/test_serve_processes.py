"""Multi-process `flowyard serve`: a supervisor, 2 API processes on one socket, one
engine process with its runners. Webhooks (async and `?wait=`) from concurrent
clients while one API process is SIGKILLed: every 202 has a completed execution,
no execution runs twice to completion, and the port keeps answering."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.queue.models import Execution
from tests.engine.test_processes import ADMIN, _empty, _free_port, _query, summaries_of

pytestmark = [pytest.mark.slow]
FINAL = ("succeeded", "failed", "cancelled")
WAIT = 30.0


def _children(ppid: int) -> dict[int, str]:
    """Live child processes of ``ppid``: pid -> command line."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == ppid and fields[0] != "Z":
            out[int(entry)] = cmdline
    return out


def _api_pids(ppid: int) -> list[int]:
    return sorted(pid for pid, cmd in _children(ppid).items() if "flowyard.cli _api" in cmd)


class Serve:
    def __init__(self, db_url: str | None, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.db_url = db_url or f"sqlite+aiosqlite:///{(tmp / 'flowyard.db').resolve()}"
        self.env = {
            **os.environ,
            "FLOWYARD_DATA_DIR": str(tmp),
            "FLOWYARD_PORT": str(self.port),
            "FLOWYARD_ADMIN_USERNAME": ADMIN[0],
            "FLOWYARD_ADMIN_PASSWORD": ADMIN[1],
            "FLOWYARD_RUNNERS": "1",
            "FLOWYARD_STOP_GRACE_SECONDS": "5",
            "FLOWYARD_LOG_LEVEL": "warning",
            # Backstops far beyond the waits below: only the notification channel can wake
            # the engine and answer ?wait= in time.
            "FLOWYARD_POLL_INTERVAL": "20",
            "FLOWYARD_WAIT_POLL_INTERVAL": "120",
        }
        if db_url is not None:
            self.env["FLOWYARD_DATABASE_URL"] = db_url
        self.env.update(env or {})
        exe = str(Path(sys.executable).with_name("flowyard"))
        self.out = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [exe, "serve", "--api-processes", "2"], env=self.env, stdout=self.out, stderr=subprocess.STDOUT
        )

    def log(self) -> str:
        return (self.tmp / "serve.log").read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                ready = httpx.get(f"{self.base}/health/ready", timeout=1).status_code == 200
                if ready and len(_api_pids(self.proc.pid)) == 2:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve did not become ready: {self.log()}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.out.close()
        return code


@pytest.fixture(params=["sqlite", "postgres"])
def serve(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Serve]:
    url = None
    if request.param == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        asyncio.run(_empty(url))  # serve then creates the administrator
    s = Serve(url, tmp_path)
    try:
        s.wait_ready()
        yield s
    finally:
        children = list(_children(s.proc.pid))
        code = s.stop()
        assert code == 0, s.log()
        for pid in children:  # SIGTERM reached them all and the supervisor waited for them
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def _flow(s: Serve) -> str:
    r = httpx.post(f"{s.base}/login", json={"username": ADMIN[0], "password": ADMIN[1]})
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    body = {
        "name": "echo",
        "type": "ordinary",
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "slow", "componentId": "delay", "fields": {"seconds": 0.02}},
            ],
            "edges": [{"source": "in", "target": "slow"}],
        },
    }
    fid = str(httpx.post(f"{s.base}/flows", json=body, headers=headers).json()["data"]["id"])
    assert httpx.post(f"{s.base}/flows/{fid}/start", headers=headers).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(f"{s.base}/flows/{fid}", headers=headers).json()["data"]["status"] == "active":
            return fid
        time.sleep(0.1)
    raise AssertionError("flow did not become active")


def test_sigkilled_api_process_loses_nothing(serve: Serve) -> None:
    s = serve
    fid = _flow(s)
    accepted: list[str] = []  # execution ids answered 202
    waited: list[tuple[int, float, Any]] = []  # (i, seconds, body) of ?wait= answered 200
    queued_after_wait: list[str] = []  # ?wait= that timed out: answered 202
    failures: list[str] = []
    errors = 0
    answered_after_kill = 0
    killed = threading.Event()
    lock = threading.Lock()
    counter = iter(range(1_000_000))

    def client(n: int) -> None:
        nonlocal errors, answered_after_kill
        with httpx.Client(base_url=s.base, timeout=WAIT + 15) as c:
            for _ in range(60 if n % 2 else 25):
                with lock:
                    i = next(counter)
                sync = n % 2 == 0
                url = f"/webhooks/{fid}?wait={WAIT:g}" if sync else f"/webhooks/{fid}"
                started = time.monotonic()
                try:
                    r = c.post(url, json={"i": i})
                except httpx.HTTPError:
                    with lock:
                        errors += 1  # in flight on the killed process
                    continue
                took = time.monotonic() - started
                with lock:
                    if killed.is_set():
                        answered_after_kill += 1
                    if r.status_code == 202:
                        eid = r.json()["data"]["executionId"]
                        (queued_after_wait if sync else accepted).append(eid)
                    elif r.status_code == 200 and sync:
                        waited.append((i, took, r.json()))
                    else:
                        failures.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    supervisor = s.proc.pid
    before = _api_pids(supervisor)
    # Mid-load: once a good share of the webhooks were answered.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(accepted) + len(waited) < 60:
        time.sleep(0.02)
    victim = before[0]
    os.kill(victim, signal.SIGKILL)
    killed.set()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads)

    assert not failures, failures
    assert answered_after_kill > 0, "the port kept answering after the kill"
    # ?wait= answered by the completion notice, well before the backstop could have: the
    # execution ran in the engine process, the reply came from an API process.
    assert waited and not queued_after_wait, (len(waited), queued_after_wait)
    assert all(body == {"i": i} for i, _took, body in waited)
    assert all(took < WAIT for _i, took, _body in waited)

    # The supervisor restarted the killed API process.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = _api_pids(supervisor)
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.1)
    assert len(now) == 2 and victim not in now, (before, now)
    assert httpx.get(f"{s.base}/health/ready", timeout=5).status_code == 200

    # Every 202 has a completed execution; none ran twice to completion.
    deadline = time.monotonic() + 60
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = _query(s.db_url, sa.select(Execution.id, Execution.status))
        if all(r[1] in FINAL for r in rows):
            break
        time.sleep(0.2)
    status = dict((r[0], r[1]) for r in rows)
    assert all(status.get(eid) == "succeeded" for eid in accepted), [
        (eid, status.get(eid)) for eid in accepted if status.get(eid) != "succeeded"
    ]
    assert {st for st in status.values()} == {"succeeded"}
    # At least every answered request has its execution (others died with the killed process
    # after their commit, or before it).
    assert len(status) >= len(accepted) + len(waited)
    summaries = summaries_of(s.db_url)
    assert len(summaries) == len(status) and {n for _e, n in summaries} == {1}
    assert "Traceback" not in s.log(), s.log()
