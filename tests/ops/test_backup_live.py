"""`flowyard backup` of a live `flowyard serve` (a supervisor, two API processes and the engine,
all real subprocesses) while clients send webhooks: the backup restores to a database that passes
integrity_check and holds every execution acknowledged (202) before the backup started; restore
refuses to run while serve does."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_cli import run
from tests.engine.test_serve_processes import Serve, _flow

pytestmark = [pytest.mark.slow]


def test_backup_under_webhook_load_holds_every_acknowledged_execution(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    s = Serve(None, data)
    stop = threading.Event()
    lock = threading.Lock()
    acknowledged: list[str] = []
    failures: list[str] = []
    try:
        s.wait_ready()
        fid = _flow(s)

        def client() -> None:
            with httpx.Client(base_url=s.base, timeout=30) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    r = c.post(f"/webhooks/{fid}", json={"i": i})
                    with lock:
                        if r.status_code == 202:
                            acknowledged.append(r.json()["data"]["executionId"])
                        else:
                            failures.append(f"{r.status_code} {r.text[:200]}")

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(acknowledged) < 100:
            time.sleep(0.02)
        with lock:
            before = list(acknowledged)
        assert len(before) >= 100, failures
        made = run("backup", str(tmp_path / "backup"), env=s.env)
        with lock:
            during = len(acknowledged) - len(before)
        assert "backup of revision" in made.stdout
        # Restore refuses while serve has the database open, and touches nothing.
        files = sorted(p.name for p in data.iterdir())
        refused = run("restore", str(tmp_path / "backup"), env=s.env, ok=False)
        assert refused.returncode != 0 and "stop the service" in refused.stderr, refused.stderr
        assert sorted(p.name for p in data.iterdir()) == files
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not failures, failures
    finally:
        stop.set()
        code = s.stop()
    assert code == 0, s.log()
    assert "Traceback" not in s.log(), s.log()

    # Restored into another data directory, as on a new machine.
    restored = tmp_path / "restored"
    env = {**s.env, "FLOWYARD_DATA_DIR": str(restored)}
    out = run("restore", str(tmp_path / "backup"), env=env)
    assert "restored revision" in out.stdout
    conn = sqlite3.connect(restored / "flowyard.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        # Stored as 12 bytes (flowyard.db.compact): the hex is the id.
        ids = {r[0].hex() for r in conn.execute("SELECT id FROM executions")}
    finally:
        conn.close()
    missing = set(before) - ids
    assert not missing, f"{len(missing)} of {len(before)} acknowledged executions missing"
    assert (restored / "secret.key").read_bytes() == (data / "secret.key").read_bytes()
    # The load went on while the command ran (else this proves nothing about online backups).
    assert during > 0
    # Rows running at the copy keep their leases: the restored engine re-queues them when they
    # expire. Not what this looks at, hence the long --stuck-after.
    check = json.loads(run("check", "--json", "--stuck-after", "3600", env=env).stdout)
    assert check["ok"] is True, check
