"""Durable waiting (SPEC §11), with a real `flowyard serve`: executions parked in long delays and
in retry waits survive SIGKILL of every flowyard process; after a restart each resumes once,
none early, none lost. Checked through a loopback server the flows call (one call each after
the wait) and the database."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.queue.models import Execution
from tests.engine.test_processes import ADMIN, _empty, _free_port, _query

pytestmark = [pytest.mark.slow]
# Long enough that every execution is still parked when the processes are killed on a loaded
# machine (the test checks that it is before it kills).
DELAYS = (60, 65, 70)  # seconds, one flow each
RETRY_WAIT = 60.0  # the retry flow's interval before its second attempt
N_DELAY, N_RETRY = 300, 200  # the 500 waiting executions, delays and retry waits mixed


class _Upstream(BaseHTTPRequestHandler):
    """``POST /<key>``: records the arrival; keys starting ``r-`` answer 503 the first time."""

    seen: dict[str, list[float]] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = self.path.strip("/").partition("?")[0]
        with self.lock:
            arrivals = self.seen.setdefault(key, [])
            arrivals.append(time.monotonic())
            n = len(arrivals)
        code = 503 if key.startswith("r-") and n == 1 else 200
        out = json.dumps({"k": key.removeprefix("r-")}).encode()  # the next step's key
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


class _Serve:
    """`flowyard serve` in its own session, so its whole process group can be SIGKILLed."""

    def __init__(self, db_url: str, tmp: Path, port: int, run: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.tmp = tmp
        env = {
            **os.environ,
            "FLOWYARD_DATA_DIR": str(tmp),
            "FLOWYARD_DATABASE_URL": db_url,
            "FLOWYARD_PORT": str(port),
            "FLOWYARD_ADMIN_USERNAME": ADMIN[0],
            "FLOWYARD_ADMIN_PASSWORD": ADMIN[1],
            "FLOWYARD_RUNNERS": "1",
            "FLOWYARD_LOG_LEVEL": "warning",
            "FLOWYARD_OUTBOUND_ALLOW_NETWORKS": "127.0.0.0/8",
            "FLOWYARD_RESUME_POLL_SECONDS": "1",
        }
        self.log_path = tmp / f"serve-{run}.log"
        self.out = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        exe = str(Path(sys.executable).with_name("flowyard"))
        self.proc = subprocess.Popen(
            [exe, "serve", "--api-processes", "1"],
            env=env,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(f"{self.base}/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve did not become ready: {self.log()}")

    def kill_all(self) -> None:
        """SIGKILL every process of the group: supervisor, API, engine, runners."""
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        self.out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
                self.proc.wait()
        self.out.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url_for_serve(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        asyncio.run(_empty(url))
        return url
    return f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"


@pytest.fixture
def upstream() -> Iterator[str]:
    _Upstream.seen = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _active(s: _Serve, headers: dict[str, str], name: str, nodes: list[dict[str, Any]]) -> str:
    edges = [{"source": a["id"], "target": b["id"]} for a, b in itertools.pairwise(nodes)]
    body = {"name": name, "type": "ordinary", "graph": {"nodes": nodes, "edges": edges}}
    r = httpx.post(f"{s.base}/flows", json=body, headers=headers)
    assert r.status_code == 201, r.text
    fid = str(r.json()["data"]["id"])
    assert httpx.post(f"{s.base}/flows/{fid}/start", headers=headers).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(f"{s.base}/flows/{fid}", headers=headers).json()["data"]["status"] == "active":
            return fid
        time.sleep(0.1)
    raise AssertionError("flow did not become active")


def _statuses(url: str, ids: list[str]) -> dict[str, str]:
    rows = _query(url, sa.select(Execution.id, Execution.status).where(Execution.id.in_(ids)))
    return {r.id: r.status for r in rows}


def _until(predicate: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_parked_executions_survive_sigkill_of_every_process(
    db_url_for_serve: str, upstream: str, tmp_path: Path
) -> None:
    url = db_url_for_serve
    port = _free_port()
    s = _Serve(url, tmp_path, port, 1)
    try:
        s.wait_ready()
        token = httpx.post(f"{s.base}/login", json={"username": ADMIN[0], "password": ADMIN[1]}).json()[
            "token"
        ]
        headers = {"Authorization": f"Bearer {token}"}
        done = {"id": "done", "componentId": "http", "fields": {"url": upstream + "/{{k}}", "method": "POST"}}
        delay_flows = {
            seconds: _active(
                s,
                headers,
                f"delay {seconds}",
                [{"id": "in"}, {"id": "d", "componentId": "delay", "fields": {"seconds": seconds}}, done],
            )
            for seconds in DELAYS
        }
        retry_node = {
            "id": "call",
            "componentId": "http",
            "fields": {"url": upstream + "/r-{{k}}", "method": "POST"},
            "retry": {"maxAttempts": 3, "initialInterval": RETRY_WAIT, "jitter": 0},
        }
        after_retry = {**done, "fields": {"url": upstream + "/{{body.k}}", "method": "POST"}}
        retry_flow = _active(s, headers, "retry", [{"id": "in"}, retry_node, after_retry])

        started: dict[str, tuple[str, float, float]] = {}  # execution id: key, sent at, min wait

        def send(i: int) -> None:
            key = f"e{i}"
            if i < N_DELAY:
                seconds = DELAYS[i % len(DELAYS)]
                fid, wait = delay_flows[seconds], float(seconds)
            else:
                fid, wait = retry_flow, RETRY_WAIT
            sent = time.monotonic()
            r = httpx.post(f"{s.base}/webhooks/{fid}", json={"k": key}, timeout=30)
            assert r.status_code == 202, r.text
            started[r.json()["data"]["executionId"]] = (key, sent, wait)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(send, range(N_DELAY + N_RETRY)))
        ids = list(started)

        _until(
            lambda: set(_statuses(url, ids).values()) == {"waiting"},
            120,
            f"all parked: {_statuses(url, ids)}",
        )
        s.kill_all()
    except BaseException:
        s.stop()
        raise
    # Every process is gone; what waits is in the database only.
    assert set(_statuses(url, ids).values()) == {"waiting"}
    assert not any(k.startswith("e") for k in _Upstream.seen)  # no execution went on yet

    s2 = _Serve(url, tmp_path, port, 2)
    try:
        s2.wait_ready()
        _until(
            lambda: set(_statuses(url, ids).values()) <= {"succeeded", "failed", "cancelled"},
            240,
            "all resumed and finished",
        )
    finally:
        s2.stop()
    assert set(_statuses(url, ids).values()) == {"succeeded"}, s2.log()
    for _eid, (key, sent, wait) in started.items():
        arrivals = _Upstream.seen.get(key, [])
        assert len(arrivals) == 1, (key, arrivals)  # resumed once: the step after the wait ran once
        assert arrivals[0] - sent >= wait  # never early
        if f"r-{key}" in _Upstream.seen:
            first, second = _Upstream.seen[f"r-{key}"]  # one failed attempt, one retry
            assert second - first >= RETRY_WAIT
