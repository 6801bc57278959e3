"""Shared bench plumbing: a server process, a lean keep-alive HTTP load
generator and percentile maths. Everything talks to 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

ADMIN = ("bench@example.com", "bench password 123")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """``flowyard serve`` in a subprocess with its own data directory."""

    env_extra: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="flowyard-bench-")))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    exe: str | None = None  # the flowyard executable (default: the one next to this Python)
    peak_rss: int = 0
    _sampling: bool = False

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "FLOWYARD_DATA_DIR": str(self.data_dir),
            "FLOWYARD_PORT": str(self.port),
            "FLOWYARD_ADMIN_USERNAME": ADMIN[0],
            "FLOWYARD_ADMIN_PASSWORD": ADMIN[1],
            "FLOWYARD_LOG_LEVEL": "warning",
            **self.env_extra,
        }
        exe = self.exe or str(Path(sys.executable).with_name("flowyard"))
        self.log = open(self.data_dir / "server.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [exe, "serve", *self.args], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit((self.data_dir / "server.log").read_text())
            try:
                if httpx.get(f"{self.base}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        self._sampling = True
        threading.Thread(target=self._sample_rss, daemon=True).start()

    def _sample_rss(self) -> None:
        assert self.proc is not None
        while self._sampling:
            try:
                self.peak_rss = max(self.peak_rss, self.rss())
            except psutil.Error:
                return
            time.sleep(0.2)

    def _tree(self) -> list[psutil.Process]:
        """The server and all its processes (API processes, engine, runners)."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def rss(self) -> int:
        total = 0
        for p in self._tree():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def cpu(self) -> float:
        """CPU seconds (user + system) the server's process tree has used so far."""
        total = 0.0
        for p in self._tree():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def stop(self) -> None:
        self._sampling = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def finish(self, *, keep: bool = False) -> None:
        """Stop the server and delete its data directory unless ``keep``."""
        self.stop()
        if keep:
            print(f"data kept in {self.data_dir}")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def login(self, username: str = ADMIN[0], password: str = ADMIN[1]) -> dict[str, str]:
        """Bearer headers of a session for ``username`` (default: the administrator)."""
        r = httpx.post(f"{self.base}/login", json={"username": username, "password": password})
        r.raise_for_status()
        return {"Authorization": f"Bearer {r.json()['token']}"}


@dataclass
class LoadResult:
    ok: int
    errors: dict[int, int]
    seconds: float
    latencies: list[float]
    responses: list[bytes]

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"p50 {pct(ms, 50):.2f} ms, p99 {pct(ms, 99):.2f} ms, mean {statistics.fmean(ms):.2f} ms"


async def _client(
    port: int,
    make_request: Callable[[int], bytes],
    expect: int,
    stop_at: float,
    result: LoadResult,
    keep: bool,
    counter: list[int],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            counter[0] += 1
            request = make_request(counter[0])
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length) if length else b""
            result.latencies.append(time.perf_counter() - started)
            if status == expect:
                result.ok += 1
                if keep:
                    result.responses.append(body)
            else:
                result.errors[status] = result.errors.get(status, 0) + 1
    finally:
        writer.close()


def post_request(
    path: str, body_for: Callable[[int], Any], headers: dict[str, str] | None = None
) -> Callable[[int], bytes]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    def make(i: int) -> bytes:
        body = orjson.dumps(body_for(i))
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    return make


def get_request(path_for: Callable[[int], str], headers: dict[str, str]) -> Callable[[int], bytes]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())

    def make(i: int) -> bytes:
        return f"GET {path_for(i)} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()

    return make


def run_load(
    port: int,
    make_request: Callable[[int], bytes],
    *,
    clients: int,
    seconds: float,
    expect: int = 200,
    keep_bodies: bool = False,
) -> LoadResult:
    """``clients`` keep-alive connections, each sending requests back to back for ``seconds``."""
    result = LoadResult(0, {}, seconds, [], [])

    async def main() -> None:
        stop_at = time.perf_counter() + seconds
        counter = [0]
        started = time.perf_counter()
        await asyncio.gather(
            *(
                _client(port, make_request, expect, stop_at, result, keep_bodies, counter)
                for _ in range(clients)
            )
        )
        result.seconds = time.perf_counter() - started

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return result
