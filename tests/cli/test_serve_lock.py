"""One `flowyard serve` per SQLite database: a second one on the same data directory (another
port) refuses to start and names the first; once the first is gone, even killed, it starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

EXE = str(Path(sys.executable).with_name("flowyard"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(data: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWYARD_")}
    env.update(
        FLOWYARD_DATA_DIR=str(data),
        FLOWYARD_PORT=str(port),
        FLOWYARD_ADMIN_USERNAME="admin@example.com",
        FLOWYARD_ADMIN_PASSWORD="a-long-enough-password",
        FLOWYARD_RUNNERS="1",
        FLOWYARD_API_PROCESSES="1",
        FLOWYARD_LOG_LEVEL="warning",
    )
    return env


def _start(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([EXE, "serve"], env=_env(data, port), stdout=out, stderr=subprocess.STDOUT)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(log.read_text())


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_a_second_serve_on_the_same_data_refuses_and_names_the_first(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first_port, second_port = _free_port(), _free_port()
    first = _start(data, first_port, tmp_path / "first.log")
    try:
        _wait_ready(first, first_port, tmp_path / "first.log")
        second = subprocess.run(
            [EXE, "serve"], env=_env(data, second_port), capture_output=True, text=True, timeout=60
        )
        assert second.returncode != 0
        assert f"pid {first.pid}" in second.stderr and f":{first_port}" in second.stderr, second.stderr
        assert "FLOWYARD_DATA_DIR" in second.stderr
        assert _refused(second_port)
        # The first goes on serving, untouched.
        assert httpx.get(f"http://127.0.0.1:{first_port}/health/ready", timeout=5).status_code == 200
        # Another data directory is another database: allowed beside it.
        other = _start(tmp_path / "other", second_port, tmp_path / "other.log")
        try:
            _wait_ready(other, second_port, tmp_path / "other.log")
        finally:
            other.send_signal(signal.SIGTERM)
            other.wait(timeout=60)
    finally:
        # A SIGKILL leaves no stale lock: the kernel drops it with the process.
        first.kill()
        first.wait(timeout=30)
    again = _start(data, second_port, tmp_path / "again.log")
    try:
        _wait_ready(again, second_port, tmp_path / "again.log")
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=60) == 0
    assert oct((data / "flowyard.db.serve-lock").stat().st_mode & 0o777) == oct(0o600)
