"""PgBouncer in transaction mode in front of the test database: the API and a worker
run through it (webhooks in, executions complete, lists, cron ticks) while each
process's LISTEN connection goes direct (FLOWYARD_NOTIFY_DATABASE_URL).

PgBouncer gets two server connections for many client connections, so consecutive
transactions of one client connection land on different server connections: any
state one of them left on the server (a named prepared statement, a session
advisory lock, a SET) would be missing or in the way in the next.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from flowyard.db import migrate
from flowyard.db.session import Database, asyncpg_dsn, pgbouncer_option
from flowyard.queue.models import Execution
from flowyard.queue.notify import PostgresNotifier, open_notifier
from tests.conftest import IN_CI, flow_body
from tests.engine.test_processes import Cluster, _empty, _free_port, _login, _query

pytestmark = [pytest.mark.slow]
SERVER_CONNECTIONS = 2


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
    )
    if found is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return found


class PgBouncer:
    """pgbouncer in transaction mode on a free loopback port, in front of one database."""

    def __init__(self, postgres_url: str) -> None:
        self.target = sa.make_url(postgres_url)
        self.port = _free_port()
        # Readable by the user pgbouncer switches to when started as root (it refuses to run as root).
        self.dir = Path(tempfile.mkdtemp(prefix="flowyard-pgbouncer-"))
        self.dir.chmod(0o755)
        t = self.target
        server = f"host={t.host or '127.0.0.1'} port={t.port or 5432} dbname={t.database} user={t.username}"
        if t.password:
            server += f" password={t.password}"
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{t.database} = {server}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {SERVER_CONNECTIONS}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 1000\n"
            # A client waits for a free server connection this long before pgbouncer gives up.
            "query_wait_timeout = 60\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        args = [_pgbouncer_binary()]
        if os.getuid() == 0:
            user = next(u for u in ("postgres", "nobody") if _user_exists(u))
            info = pwd.getpwnam(user)
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, info.pw_uid, info.pw_gid)
            args += ["-u", user]
        args.append(str(self.dir / "pgbouncer.ini"))
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"pgbouncer exited: {self.log()}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"pgbouncer did not listen: {self.log()}")

    def url(self, *, option: bool = True) -> str:
        url = self.target.set(host="127.0.0.1", port=self.port)
        if option:
            url = url.update_query_dict({"pgbouncer": "true"})
        return url.render_as_string(hide_password=False)

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def pgbouncer(postgres_url: str) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(postgres_url)
    try:
        yield bouncer
    finally:
        bouncer.stop()


def test_pgbouncer_option_is_parsed_once() -> None:
    url, on = pgbouncer_option(sa.make_url("postgresql+asyncpg://u@h:6432/d?pgbouncer=true"))
    assert on and "pgbouncer" not in url.query
    assert pgbouncer_option(sa.make_url("postgresql+asyncpg://u@h/d?pgbouncer=0"))[1] is False
    assert pgbouncer_option(sa.make_url("postgresql+asyncpg://u@h/d"))[1] is False
    with pytest.raises(ValueError, match="pgbouncer='maybe'"):
        pgbouncer_option(sa.make_url("postgresql+asyncpg://u@h/d?pgbouncer=maybe"))
    with pytest.raises(ValueError, match="PostgreSQL only"):
        pgbouncer_option(sa.make_url("sqlite+aiosqlite:///x.db?pgbouncer=true"))
    # The direct DSN for LISTEN carries neither flowyard's nor SQLAlchemy's options.
    dsn = asyncpg_dsn("postgresql+asyncpg://u:p@h/d?pgbouncer=true&prepared_statement_cache_size=0")
    assert dsn == "postgresql://u:p@h/d"


def test_listen_never_goes_through_pgbouncer(caplog: pytest.LogCaptureFixture) -> None:
    bounced = "postgresql+asyncpg://u@pgbouncer:6432/d?pgbouncer=true"
    only_send = open_notifier(bounced)
    assert isinstance(only_send, PostgresNotifier) and only_send.dsn is None
    assert "FLOWYARD_NOTIFY_DATABASE_URL" in caplog.text
    direct = open_notifier(bounced, "postgresql+asyncpg://u@db:5432/d")
    assert isinstance(direct, PostgresNotifier) and direct.dsn == "postgresql://u@db:5432/d"


async def _interleave(url: str) -> None:
    """Client A runs a statement, client B holds the server connection A used, A runs the
    same statement again: through transaction pooling it lands on the other server connection."""
    db = Database(url)
    try:
        stmt = sa.select(sa.func.count()).select_from(Execution)
        async with db.engine.connect() as a, db.engine.connect() as b:
            await a.execute(stmt)
            await a.commit()
            await b.execute(sa.text("SELECT 1"))  # B's transaction holds that server connection
            await a.execute(stmt)
            await a.commit()
            await b.commit()
    finally:
        await db.dispose()


def test_transaction_pooling_needs_the_option(pgbouncer: PgBouncer, postgres_url: str) -> None:
    migrate.upgrade(pgbouncer.url())  # migrations run through PgBouncer too (transaction-scoped lock)
    # Without the option, asyncpg's named prepared statement is missing on the other server connection.
    with pytest.raises(DBAPIError, match="prepared statement"):
        asyncio.run(_interleave(pgbouncer.url(option=False)))
    asyncio.run(_interleave(pgbouncer.url()))


@pytest.fixture
def bounced(pgbouncer: PgBouncer, postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    asyncio.run(_empty(postgres_url))
    c = Cluster(pgbouncer.url(option=False), tmp_path)
    c.env["FLOWYARD_DATABASE_PGBOUNCER"] = "true"  # the setting adds ?pgbouncer=true
    c.env["FLOWYARD_NOTIFY_DATABASE_URL"] = postgres_url
    # Backstops far beyond the waits below: only LISTEN (direct) wakes the worker and answers ?wait=.
    c.env["FLOWYARD_POLL_INTERVAL"] = "30"
    c.env["FLOWYARD_WAIT_POLL_INTERVAL"] = "120"
    c.start("api", "serve", "--no-engine")
    try:
        c.wait_ready()
        c.start("worker", "worker")
        yield c
    finally:
        c.stop_all()


def _backends(postgres_url: str) -> list[tuple[str, str]]:
    name = sa.make_url(postgres_url).database
    return [
        (str(r[0]), str(r[1]))
        for r in _query(
            postgres_url,
            sa.text(
                "SELECT state, query FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
            ).bindparams(d=name),
        )
    ]


def test_api_and_worker_through_pgbouncer(bounced: Cluster, pgbouncer: PgBouncer, postgres_url: str) -> None:
    c = bounced
    headers = _login(c)
    graph = {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {"id": "reply", "componentId": "respond"},  # replies with the webhook's body
        ],
        "edges": [{"source": "in", "target": "reply"}],
    }
    created = httpx.post(f"{c.base}/flows", json=flow_body("bounced", graph=graph), headers=headers)
    fid = created.json()["data"]["id"]
    assert httpx.post(f"{c.base}/flows/{fid}/start", headers=headers).status_code == 200
    deadline = time.monotonic() + 60
    while httpx.get(f"{c.base}/flows/{fid}", headers=headers).json()["data"]["status"] != "active":
        assert time.monotonic() < deadline, c.log("worker")
        time.sleep(0.1)

    async def load() -> tuple[list[str], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=c.base, timeout=30) as client:
            posts = await asyncio.gather(*(client.post(f"/webhooks/{fid}", json={"i": i}) for i in range(80)))
            waits = await asyncio.gather(
                *(client.post(f"/webhooks/{fid}?wait=20", json={"w": i}) for i in range(10))
            )
        assert {r.status_code for r in posts} == {202}, [r.text for r in posts if r.status_code != 202]
        return [r.json()["data"]["executionId"] for r in posts], list(waits)

    accepted, waits = asyncio.run(load())
    # The worker woke through LISTEN (polling is 30 s away) and the API heard the finish (120 s).
    assert [(r.status_code, r.json()) for r in waits] == [(200, {"w": i}) for i in range(10)], c.log("api")
    deadline = time.monotonic() + 60
    while True:
        rows = _query(postgres_url, sa.select(Execution.id, Execution.status).where(Execution.flow_id == fid))
        if len(rows) == 90 and {r[1] for r in rows} == {"succeeded"}:
            break
        assert time.monotonic() < deadline, (rows, c.log("worker"))
        time.sleep(0.2)
    assert set(accepted) <= {r[0] for r in rows}

    # A list read through PgBouncer: every execution, paged.
    seen: list[str] = []
    for page in (1, 2, 3, 4):
        r = httpx.get(
            f"{c.base}/flows/{fid}/executions",
            params={"page[number]": page, "page[size]": 30},
            headers=headers,
        )
        assert r.status_code == 200, r.text
        seen += [e["id"] for e in r.json()["data"]]
    assert sorted(seen) == sorted(r[0] for r in rows)

    # Cron ticks fired by the worker's scheduler through PgBouncer: one execution per tick.
    cron = httpx.post(f"{c.base}/flows", json=flow_body("ticks", cron="* * * * * *"), headers=headers)
    cid = cron.json()["data"]["id"]
    assert httpx.post(f"{c.base}/flows/{cid}/start", headers=headers).status_code == 200
    deadline = time.monotonic() + 60
    ticks: list[object] = []
    while len(ticks) < 3:
        assert time.monotonic() < deadline, c.log("worker")
        time.sleep(0.3)
        stmt = sa.select(Execution.scheduled_for).where(Execution.flow_id == cid)
        ticks = [r[0] for r in _query(postgres_url, stmt)]
    assert httpx.post(f"{c.base}/flows/{cid}/stop", headers=headers).status_code == 200
    seconds = [int(t.timestamp()) for t in ticks]  # type: ignore[attr-defined]
    # No tick fired twice (a missed one under an overloaded machine is the scheduler's matter,
    # covered by test_processes; what PgBouncer could break is the claim of a tick).
    assert len(set(seconds)) == len(seconds) and all(t.microsecond == 0 for t in ticks)  # type: ignore[attr-defined]

    # What reached PostgreSQL: PgBouncer's server connections (at most its pool) plus one direct
    # LISTEN connection per process.
    backends = _backends(postgres_url)
    listeners = [b for b in backends if b[1].startswith("LISTEN")]
    assert len(listeners) == 2, backends
    assert len(backends) - len(listeners) <= SERVER_CONNECTIONS, backends
    for name in ("api", "worker"):
        assert "Traceback" not in c.log(name), c.log(name)
        assert "prepared statement" not in c.log(name), c.log(name)
