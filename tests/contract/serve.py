"""A real ``flowyard serve`` (API and engine, one process) on loopback, for the contract tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ADMIN = ("contract-admin@example.com", "a long admin password")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bin_path(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


class Server:
    """``flowyard serve`` in a subprocess, on loopback."""

    def __init__(self, db_url: str, tmp: Path) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "FLOWYARD_DATABASE_URL": db_url,
            "FLOWYARD_DATA_DIR": str(tmp),
            "FLOWYARD_HOST": "127.0.0.1",
            "FLOWYARD_PORT": str(self.port),
            "FLOWYARD_ADMIN_USERNAME": ADMIN[0],
            "FLOWYARD_ADMIN_PASSWORD": ADMIN[1],
            "FLOWYARD_LOG_LEVEL": "warning",
            "FLOWYARD_API_PROCESSES": "1",
            "FLOWYARD_RUNNERS": "1",
        }
        self.log = tmp / "serve.log"
        out = open(self.log, "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [bin_path("flowyard"), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 120  # a liveness bound: the first start migrates
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.log.read_text(errors='replace')}")
            time.sleep(0.2)
        raise AssertionError("serve did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
