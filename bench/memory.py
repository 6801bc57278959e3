"""Memory per process of `flowyard serve` on SQLite: RSS, PSS and USS of the server and each of its
runner processes, idle after start and after a short webhook load (webhook -> JSONata mapper ->
log, the flow of bench/webhooks.py), and the peak of the whole tree during the load.

    .venv/bin/python bench/memory.py [--clients 32] [--seconds 5] [--flowyard PATH] [--runners N]

``--flowyard`` picks the ``flowyard`` executable to serve with (default: the one next to this
Python), e.g. that of a venv made by ``make run`` alone (requirements-run.lock, no test tools).
PSS and USS come from /proc/<pid>/smaps_rollup (USS: private clean + private dirty).
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import psutil
from _common import Server, post_request, run_load
from webhooks import FLOW

PAYLOAD = {"order": {"id": "A-1", "items": [{"price": 3}, {"price": 4}]}}


def smaps(pid: int) -> dict[str, int]:
    """RSS, PSS and USS of one process, in bytes."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def role(proc: psutil.Process) -> str:
    cmd = " ".join(proc.cmdline())
    if "runner_process" in cmd:
        return "runner"
    if " serve" in cmd:
        return "serve"
    return cmd.rsplit("/", 1)[-1][:40]


def snapshot(server: Server) -> list[tuple[str, int, dict[str, int]]]:
    rows = []
    for p in server._tree():
        with contextlib.suppress(psutil.Error, OSError):
            rows.append((role(p), p.pid, smaps(p.pid)))
    return rows


def show(title: str, rows: list[tuple[str, int, dict[str, int]]]) -> None:
    print(f"{title}:")
    for name, pid, m in rows:
        print(
            f"  {name:<8} pid {pid:<8} RSS {m['rss'] / 2**20:6.1f} MiB  PSS {m['pss'] / 2**20:6.1f} MiB  "
            f"USS {m['uss'] / 2**20:6.1f} MiB"
        )
    total = {k: sum(m[k] for _, _, m in rows) for k in ("rss", "pss", "uss")}
    print(
        f"  {'all':<8} {len(rows)} processes  RSS {total['rss'] / 2**20:6.1f} MiB  "
        f"PSS {total['pss'] / 2**20:6.1f} MiB  USS {total['uss'] / 2**20:6.1f} MiB"
    )


class PeakSampler:
    """The highest RSS of each process and of the sum, sampled every 0.1 s."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.per_pid: dict[int, tuple[str, int]] = {}
        self.total = 0
        self._on = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._on:
            total = 0
            for p in self.server._tree():
                with contextlib.suppress(psutil.Error):
                    rss = p.memory_info().rss
                    total += rss
                    seen = self.per_pid.get(p.pid, ("", 0))[1]
                    if rss > seen:
                        self.per_pid[p.pid] = (role(p), rss)
            self.total = max(self.total, total)
            time.sleep(0.1)

    def stop(self) -> None:
        self._on = False
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--flowyard", default=None, help="The flowyard executable to serve with.")
    parser.add_argument("--runners", type=int, default=None, help="FLOWYARD_RUNNERS (default: the server's).")
    args = parser.parse_args()

    env = {"FLOWYARD_RUNNERS": str(args.runners)} if args.runners else {}
    server = Server(env_extra=env, exe=args.flowyard)
    server.start()
    try:
        headers = server.login()
        flow = httpx.post(f"{server.base}/flows", json=FLOW, headers=headers).json()["data"]
        httpx.post(f"{server.base}/flows/{flow['id']}/start", headers=headers).raise_for_status()
        while (
            httpx.get(f"{server.base}/flows/{flow['id']}", headers=headers).json()["data"]["status"]
            != "active"
        ):
            time.sleep(0.1)
        time.sleep(2)
        show("idle (after start, one flow active)", snapshot(server))
        sampler = PeakSampler(server)
        load = run_load(
            server.port,
            post_request(f"/webhooks/{flow['id']}", lambda i: PAYLOAD),
            clients=args.clients,
            seconds=args.seconds,
            expect=202,
        )
        db = Path(server.data_dir) / "flowyard.db"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with sqlite3.connect(db) as conn:
                left = conn.execute(
                    "SELECT count(*) FROM executions WHERE status IN ('queued','running')"
                ).fetchone()[0]
            if not left:
                break
            time.sleep(0.5)
        sampler.stop()
        print(
            f"load: {args.clients} clients, {load.seconds:.1f} s, {load.ok} webhooks accepted, "
            f"other answers {load.errors or 'none'}"
        )
        show("after the load (drained)", snapshot(server))
        print("peak RSS during the load:")
        peaks = sorted(sampler.per_pid.items())
        for pid, (name, rss) in peaks:
            print(f"  {name:<8} pid {pid:<8} RSS {rss / 2**20:6.1f} MiB")
        print(
            f"  {'all':<8} {len(peaks)} processes  RSS {sampler.total / 2**20:6.1f} MiB (sum at one instant)"
        )
    finally:
        server.finish()


if __name__ == "__main__":
    main()
