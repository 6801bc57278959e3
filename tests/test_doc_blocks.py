"""Every shell block of README.md and docs/*.md, as a newcomer copies it.

Each ```sh block carries a marker on the line before it: `<!-- doc-test: run: <test> -->` (a
test runs it as written, against a live `flowyard serve` started as `make run` starts it) or
`<!-- doc-test: skip: <reason> -->` (it needs more set-up than a test machine has: root,
systemd, a host named in the block). A new block without a marker fails
`test_every_shell_block_is_run_or_says_why`. The only changes the tests make to a block are the
ones its test names: the example host becomes the live server's address, example paths become
temporary ones, and `flowyard` is found in the virtual environment, as the README says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.test_processes import _free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- doc-test: (run|skip): (.+?) -->")
ADMIN = ("admin@example.com", "a-long-enough-password-1")


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    text: str
    kind: str | None  # "run" | "skip" | None (no marker)
    note: str


def blocks() -> list[Block]:
    out = []
    for path in DOCS:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            if re.match(r"```(sh|bash|shell|console)\s*$", lines[i]):
                end = lines.index("```", i + 1)
                mark = MARKER.fullmatch(lines[i - 1].strip()) if i else None
                out.append(
                    Block(
                        str(path.relative_to(ROOT)),
                        i + 1,
                        "\n".join(lines[i + 1 : end]) + "\n",
                        mark.group(1) if mark else None,
                        mark.group(2) if mark else "",
                    )
                )
                i = end
            i += 1
    return out


def block_run_by(test: str) -> Block:
    [found] = [b for b in blocks() if b.kind == "run" and b.note.endswith(f"::{test}")]
    return found


def test_every_shell_block_is_run_or_says_why() -> None:
    found = blocks()
    assert len(found) >= 10, found
    unmarked = [f"{b.file}:{b.line}" for b in found if b.kind is None]
    assert not unmarked, f"shell blocks with no <!-- doc-test: run|skip: ... --> line before them: {unmarked}"
    for b in found:
        if b.kind == "run":
            file, _, name = b.note.partition("::")
            assert (ROOT / file).is_file(), b
            assert not name or f"def {name}(" in (ROOT / file).read_text(), b
        else:
            assert len(b.note) > 20, f"{b.file}:{b.line}: say why it is not run"


@dataclass
class Live:
    base: str
    data: Path
    proc: subprocess.Popen[bytes]
    env: dict[str, str]

    def token(self) -> str:
        r = httpx.post(f"{self.base}/login", json={"username": ADMIN[0], "password": ADMIN[1]}, timeout=30)
        r.raise_for_status()
        return str(r.json()["token"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """`flowyard serve` as `make run` starts it (./data under tmp_path), the venv on PATH."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWYARD_")}
    env.update(
        FLOWYARD_PORT=str(port),
        FLOWYARD_LOG_LEVEL="warning",
        FLOWYARD_ADMIN_USERNAME=ADMIN[0],
        FLOWYARD_ADMIN_PASSWORD=ADMIN[1],
        FLOWYARD_API_PROCESSES="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "flowyard"), "serve"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    server = Live(f"http://127.0.0.1:{port}", tmp_path / "data", proc, env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{server.base}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "flowyard serve did not become ready"
            time.sleep(0.1)
        yield server
    finally:
        server.stop()


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_check_block(live: Live, tmp_path: Path) -> None:
    block = block_run_by("test_check_block").text
    done = _bash("set -euo pipefail\n" + block, tmp_path, live.env)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    # The second line prints one JSON document; the others one line per check.
    docs = _json_documents(done.stdout)
    assert [d["ok"] for d in docs] == [True], done.stdout


def _json_documents(text: str) -> list[Any]:
    """The JSON documents printed in ``text`` (each starting a line), skipping other lines."""
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while True:
        start = text.find("{", pos)
        if start < 0:
            return docs
        if start and text[start - 1] != "\n":
            pos = start + 1
            continue
        doc, pos = decoder.raw_decode(text, start)
        docs.append(doc)


def test_backup_and_restore_block(live: Live, tmp_path: Path) -> None:
    block = block_run_by("test_backup_and_restore_block").text
    assert block.count("/var/lib/flowyard/backups/2026-11-24") == 2
    backups = tmp_path / "backups"
    backups.mkdir()
    backup, restore = block.replace("/var/lib/flowyard/backups", str(backups)).strip().split("\n")
    token = live.token()
    flow = httpx.post(
        f"{live.base}/flows",
        headers={"Authorization": f"Bearer {token}"},
        json={"name": "kept", "type": "ordinary", "graph": _graph()},
        timeout=30,
    ).json()["data"]["id"]
    done = _bash("set -euo pipefail\n" + backup, tmp_path, live.env)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    live.stop()  # "with the service stopped"
    (live.data / "flowyard.db").unlink()
    done = _bash("set -euo pipefail\n" + restore, tmp_path, live.env)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    check = _bash("flowyard check --json", tmp_path, live.env)
    assert json.loads(check.stdout)["ok"] is True, check.stdout
    # The restored database holds the flow created before the backup.
    assert _flow_listed(live, flow)


def _flow_listed(live: Live, flow: str) -> bool:
    import sqlite3

    with sqlite3.connect(live.data / "flowyard.db") as db:
        return db.execute("select count(*) from flows where id = ?", (flow,)).fetchone()[0] == 1


def _graph() -> dict[str, object]:
    return {
        "nodes": [
            {"id": "hook", "componentId": "webhook"},
            {"id": "out", "componentId": "log"},
        ],
        "edges": [{"source": "hook", "target": "out"}],
    }


def test_when_a_flow_misbehaves_block(live: Live, tmp_path: Path) -> None:
    block = block_run_by("test_when_a_flow_misbehaves_block").text
    assert block.count("https://flowyard.example.com") == 3
    token = live.token()
    auth = {"Authorization": f"Bearer {token}"}
    tenant = httpx.post(f"{live.base}/tenants", headers=auth, json={"name": "acme"}, timeout=30).json()
    tenant_id = tenant.get("id") or tenant["data"]["id"]
    flow = httpx.post(
        f"{live.base}/flows",
        headers=auth,
        json={"name": "misbehaving", "type": "ordinary", "tenant": tenant_id, "graph": _graph()},
        timeout=30,
    ).json()["data"]["id"]
    started = httpx.post(f"{live.base}/flows/{flow}/start", headers=auth, timeout=30)
    assert started.status_code == 200, started.text
    env = {**live.env, "TOKEN": token, "TENANT": tenant_id, "FLOW": flow}
    script = "set -euo pipefail\n" + block.replace("https://flowyard.example.com", live.base).replace(
        "curl -s", "curl -sf"
    )
    done = _bash(script, tmp_path, env)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    decoder = json.JSONDecoder()
    text, pos, docs = done.stdout, 0, []
    while pos < len(text.rstrip()):
        while text[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)
    executions, logs, stopped = docs
    assert (executions["data"] == [] and "errors" not in logs and logs["data"] == []) or "data" in logs
    assert stopped["data"]["id"] == flow
