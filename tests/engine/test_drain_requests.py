"""Requests during a SIGTERM drain of a real `flowyard serve --api-processes 2`: each one is
answered, served (202) or refused 503 with Retry-After in the contract's shape, and none
hangs. The engine process still runs a long execution, so the supervisor keeps the listening
socket well after the API processes stopped accepting: before, connections made then were
never accepted, hung, and were reset when the supervisor finally closed the socket."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import flow_body
from tests.engine.test_processes import Cluster, _active_flow, _login
from tests.engine.test_serve_processes import _api_pids
from tests.engine.test_shutdown import _delay_flow, _engine_pid, _wait_held

pytestmark = [pytest.mark.slow]

DRAIN = 2.0
AFTER_DRAIN = 3.0  # seconds requests go on after the API processes stopped accepting
BOUND = 30.0  # a generous bound on any one answer: nothing hangs


def test_every_request_during_a_drain_is_answered(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"
    c = Cluster(url, tmp_path)
    c.env.update(
        {
            "FLOWYARD_API_PROCESSES": "2",
            "FLOWYARD_DRAIN_SECONDS": str(DRAIN),
            "FLOWYARD_STOP_GRACE_SECONDS": "60",
            "FLOWYARD_LEASE_SECONDS": "30",
        }
    )
    serve = c.start("serve", "serve", "--api-processes", "2")
    try:
        c.wait_ready()
        deadline = time.monotonic() + 60
        while len(_api_pids(serve.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        headers = _login(c)
        # Keeps the engine process (and so the supervisor) busy long after the drain.
        slow = _active_flow(c, headers, _delay_flow(DRAIN + AFTER_DRAIN + 8, name="long"))
        fid = _active_flow(c, headers, flow_body(name="fast"))
        assert httpx.post(f"{c.base}/webhooks/{slow}", json={}).status_code == 202
        _wait_held(url, _engine_pid(serve.pid))

        results: list[tuple[float, float, object]] = []
        stop = threading.Event()

        def send(client: httpx.Client) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                started = time.monotonic()
                try:
                    r = client.post(f"/webhooks/{fid}", json={"n": n})
                    outcome: object = r
                except httpx.HTTPError as exc:
                    outcome = exc
                results.append((started, time.monotonic() - started, outcome))
                time.sleep(0.01)

        clients = [httpx.Client(base_url=c.base, timeout=BOUND) for _ in range(3)]
        # One more opening a new connection per request (no keep-alive).
        fresh = httpx.Client(base_url=c.base, timeout=BOUND, limits=httpx.Limits(max_keepalive_connections=0))
        threads = [threading.Thread(target=send, args=(cl,)) for cl in [*clients, fresh]]
        for t in threads:
            t.start()
        time.sleep(0.5)
        signalled = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        time.sleep(DRAIN + AFTER_DRAIN)
        stop.set()
        for t in threads:
            t.join(BOUND + 10)
        # The engine still runs the long execution: the supervisor, and its socket, are still
        # there, so no request above met a closed port.
        assert serve.poll() is None
        for cl in [*clients, fresh]:
            cl.close()
        assert serve.wait(timeout=120) == 0, c.log("serve")

        during = [(s, d, o) for s, d, o in results if s >= signalled]
        failed = [
            (round(s - signalled, 2), repr(o)) for s, _d, o in during if not isinstance(o, httpx.Response)
        ]
        assert not failed, failed
        statuses: dict[int, int] = {}
        for _s, d, o in during:
            assert isinstance(o, httpx.Response)
            assert d < BOUND
            statuses[o.status_code] = statuses.get(o.status_code, 0) + 1
            if o.status_code == 503:
                assert int(o.headers["Retry-After"]) > 0
                assert o.json() == {
                    "errors": [{"message": "The service is shutting down; try again shortly.", "code": 503}]
                }
            else:
                assert o.status_code == 202, o.text
        # Served while draining, refused once the API processes stopped accepting.
        assert statuses.get(202, 0) > 0 and statuses.get(503, 0) > 0, statuses
    finally:
        c.stop_all()


def test_a_connection_accepted_before_the_stop_is_served_after_it(tmp_path: Path) -> None:
    """uvicorn closes, at its shutdown, every connection without a request in progress, and
    so resets one accepted a moment before whose request is still on the wire. Here such a
    request is served, and its connection closed after it."""
    url = f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"
    c = Cluster(url, tmp_path)
    c.env.update({"FLOWYARD_DRAIN_SECONDS": "1"})
    serve = c.start("serve", "serve")
    try:
        c.wait_ready()
        with socket.create_connection(("127.0.0.1", c.port), timeout=BOUND) as sock:
            assert httpx.get(f"{c.base}/health").status_code == 200  # the connection above is accepted
            serve.send_signal(signal.SIGTERM)
            time.sleep(1.5)  # the drain is over: the server stops accepting and shuts down
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), data
        assert b"\r\nconnection: close" in head
        assert body == b'{"status":"ok"}'
        assert serve.wait(timeout=60) == 0, c.log("serve")
    finally:
        c.stop_all()
