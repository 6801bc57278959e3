"""The HTTP floor on this machine: a bare ASGI route under uvicorn, configured as `flowyard
serve` configures it (uvloop, httptools, no access log), answering the peer bench's POST with a
small JSON `202` and doing nothing else. Measured with the peer bench's own load (wrk, one
thread, 32 connections, `post.lua`), so a flowyard figure from `../shared/peers-bench/` can be
read as a multiple of it (issue 19: "report each hot endpoint's CPU as a multiple of it").

    .venv/bin/python bench/http_floor.py [--seconds 15] [--connections 32]

Prints requests per second, latency, the server's CPU per request (from /proc, all threads)
and the host's busy share and steal during the run (from /proc/stat).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers-bench"
APP = """
import orjson

BODY = orjson.dumps({"executionId": "6b14f6133f45f3a7dfed85ff", "flowId": "6b14f611075667bfb986ac95"})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    message = await receive()
    while message.get("more_body"):
        message = await receive()
    await send({"type": "http.response.start", "status": 202, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host() -> tuple[int, int, int]:
    parts = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    steal = parts[7] if len(parts) > 7 else 0
    return sum(parts), idle, steal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"flowyard-http-floor-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "floor_app.py").write_text(APP)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "floor_app:app", "--host", "127.0.0.1", "--port", str(port),
         "--loop", "uvloop", "--http", "httptools", "--ws", "none", "--no-access-log",
         "--log-level", "warning"],
        cwd=workdir,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/webhooks/6b14f611075667bfb986ac95"
        wrk = ["wrk", "-t1", f"-c{args.connections}", "--latency", "-s", str(PEERS / "post.lua"), url]
        subprocess.run([*wrk[:1], "-d3s", *wrk[1:]], capture_output=True, check=True)  # warm-up
        cpu0, host0 = _cpu_seconds(server.pid), _host()
        out = subprocess.run([*wrk[:1], f"-d{args.seconds}s", *wrk[1:]], capture_output=True, text=True)
        cpu1, host1 = _cpu_seconds(server.pid), _host()
    finally:
        server.terminate()
        server.wait(10)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKRESULT")), out.stdout + out.stderr)
    values = dict(re.findall(r"(\w+)=([\d.]+)", line))
    requests = int(values.get("requests", 0)) or 1
    total, idle, steal = (b - a for a, b in zip(host0, host1, strict=True))
    print(
        f"bare uvicorn route: rps={float(values.get('rps', 0)):.0f} p50_ms={values.get('p50_ms')} "
        f"p99_ms={values.get('p99_ms')} non2xx={values.get('non2xx')} "
        f"cpu_ms_per_req={(cpu1 - cpu0) * 1000 / requests:.3f} "
        f"host_busy_pct={100 * (total - idle) / total:.1f} steal_pct={100 * steal / total:.1f}"
    )


if __name__ == "__main__":
    main()
