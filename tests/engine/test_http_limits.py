"""HTTP limits of the real `flowyard serve` (flowyard.http_protocol), over raw sockets on a
loopback port, with the timeouts set low through their settings: a chunked body that stalls
is answered 408 and closed, and the webhook it carried is not accepted; an oversized head and
too many header fields are answered 431 in the contract's error shape (also while the
oversized head still arrives); a head that stalls is answered 408; an idle connection and an
idle kept-alive one are closed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import flow_body
from tests.engine.test_processes import Cluster, _active_flow, _login

pytestmark = [pytest.mark.slow]

BODY_TIMEOUT = 1.0
HEADER_TIMEOUT = 2.0
KEEPALIVE_TIMEOUT = 1.0
MARGIN = 15.0  # generous: the machine is shared


class Server:
    def __init__(self, cluster: Cluster, headers: dict[str, str], flow_id: str) -> None:
        self.c = cluster
        self.headers = headers
        self.flow_id = flow_id

    def connect(self, timeout: float) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.c.port), timeout=timeout)
        return sock


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("http-limits")
    c = Cluster(f"sqlite+aiosqlite:///{(tmp / 'flowyard.db').resolve()}", tmp)
    c.env.update(
        {
            "FLOWYARD_HTTP_BODY_TIMEOUT": str(BODY_TIMEOUT),
            "FLOWYARD_HTTP_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "FLOWYARD_HTTP_KEEPALIVE_TIMEOUT": str(KEEPALIVE_TIMEOUT),
        }
    )
    c.start("serve", "serve")
    try:
        c.wait_ready()
        headers = _login(c)
        yield Server(c, headers, _active_flow(c, headers, flow_body()))
    finally:
        c.stop_all()


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout fails)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


def _assert_error(raw: bytes, status: int, words: str) -> None:
    got, headers, body = _response(raw)
    assert got == status, raw[:300]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    errors = orjson.loads(body)["errors"]
    assert [e["code"] for e in errors] == [status]
    assert words in errors[0]["message"]


def _executions(s: Server) -> list[str]:
    r = httpx.get(
        f"{s.c.base}/executions", params={"filter[flowId]": s.flow_id, "limit": 100}, headers=s.headers
    )
    assert r.status_code == 200, r.text
    return [e["id"] for e in r.json()["data"]]


def test_a_chunked_body_that_stalls_is_answered_408_and_not_accepted(server: Server) -> None:
    before = _executions(server)
    with server.connect(BODY_TIMEOUT + MARGIN) as sock:
        # The chunk says 16 bytes, two come ("42" alone would be a valid JSON body), then nothing.
        sock.sendall(
            f"POST /webhooks/{server.flow_id} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n10\r\n42".encode()
        )
        _assert_error(_read_all(sock), 408, "body")
    # The connection is free again for others, and the truncated body made no execution.
    r = httpx.post(f"{server.c.base}/webhooks/{server.flow_id}", json={"n": 1}, timeout=30)
    assert r.status_code == 202, r.text
    assert set(_executions(server)) - set(before) == {r.json()["data"]["executionId"]}


def test_a_body_shorter_than_its_content_length_is_answered_408(server: Server) -> None:
    with server.connect(BODY_TIMEOUT + MARGIN) as sock:
        sock.sendall(
            f"POST /webhooks/{server.flow_id} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{}".encode()
        )
        _assert_error(_read_all(sock), 408, "body")


def test_an_oversized_header_is_answered_431(server: Server) -> None:
    with server.connect(MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        _assert_error(_read_all(sock), 431, "exceed 32768 bytes")


def test_an_oversized_head_is_refused_while_it_still_arrives(server: Server) -> None:
    with server.connect(MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000)  # never ends
        _assert_error(_read_all(sock), 431, "exceed 32768 bytes")


def test_many_header_fields_are_answered_431(server: Server) -> None:
    fields = b"".join(b"X-H%d: 1\r\n" % i for i in range(2000))
    assert len(fields) < 32768  # the count decides, not the size
    with server.connect(MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        _assert_error(_read_all(sock), 431, "at most 100 header fields")


def test_a_head_within_the_limits_is_served(server: Server) -> None:
    fields = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 250) for i in range(98))  # 99 fields, ~26 KB
    with server.connect(MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fields[:-2] + b"\r\n\r\n")
        status, _, body = _response(_read_all(sock))
    assert status == 200 and orjson.loads(body) == {"status": "ok"}


def test_a_head_that_stalls_is_answered_408(server: Server) -> None:
    with server.connect(HEADER_TIMEOUT + MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        _assert_error(_read_all(sock), 408, "head")


def test_a_connection_that_sends_nothing_is_closed(server: Server) -> None:
    with server.connect(HEADER_TIMEOUT + MARGIN) as sock:
        assert _read_all(sock) == b""


def test_an_idle_kept_alive_connection_is_closed(server: Server) -> None:
    with server.connect(KEEPALIVE_TIMEOUT + MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b'"ok"}' not in first:
            chunk = sock.recv(65536)
            assert chunk, first
            first += chunk
        status, headers, _ = _response(first)
        assert status == 200 and "connection" not in headers  # kept alive
        assert _read_all(sock) == b""  # then closed, with nothing more sent


def test_an_unparseable_request_is_answered_400_in_the_error_shape(server: Server) -> None:
    with server.connect(MARGIN) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n")
        _assert_error(_read_all(sock), 400, "Invalid HTTP request")
