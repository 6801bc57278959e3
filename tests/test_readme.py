"""The README's "Typical use" block, run as pasted by bash against a real `flowyard serve`.

The server runs as `make run` would (embedded SQLite in ./data, a generated first-administrator
password in ./data/initial-admin-password) in a temporary directory, on a free loopback port.
The only change made to the block: `localhost:8000` becomes that port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.test_processes import _free_port

README = Path(__file__).resolve().parents[1] / "README.md"


def typical_use_block() -> str:
    text = README.read_text()
    section = text.split("## Typical use", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found, "README: no ```sh block under ## Typical use"
    return found.group(1)


def json_documents(text: str) -> list[Any]:
    """The JSON values curl printed one after another."""
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return docs
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """`flowyard serve` in tmp_path with the defaults of `make run`; yields host:port."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWYARD_")}
    env["FLOWYARD_PORT"] = str(port)
    env["FLOWYARD_LOG_LEVEL"] = "warning"
    exe = str(Path(sys.executable).with_name("flowyard"))
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([exe, "serve"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "flowyard serve did not become ready"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_readme_typical_use_runs_as_pasted(server: str, tmp_path: Path) -> None:
    block = typical_use_block()
    assert block.count("localhost:8000") >= 8
    script = "set -euo pipefail\n" + block.replace("localhost:8000", server)
    assert "localhost" not in script
    # The file format the README states is the one the server writes.
    lines = (tmp_path / "data" / "initial-admin-password").read_text().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == ["username", "password"]
    assert lines[0] == "username: admin@flowyard.local"

    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"

    started, executions, logs, counts = json_documents(done.stdout)
    flow = started["data"]["id"]
    assert started["data"]["status"] == "starting"
    [execution] = executions["data"]
    assert (execution["flowId"], execution["status"], execution["trigger"]) == (flow, "succeeded", "webhook")
    assert logs["data"], "the administrator read no logs of its own flow"
    assert {e["flowId"] for e in logs["data"]} == {flow}
    assert any(e["data"] == {"orderId": "A-1", "total": 7} for e in logs["data"]), logs
    assert [(c["flow"], c["executions"]) for c in counts["data"]] == [(flow, 1)]
