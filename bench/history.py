"""The lists over the history at scale (issue 19): fills a fresh database with executions and
their logs the way the engine makes them, then times every listing of executions and logs
(member and admin, each filter, page 1 and page 500) in-process, with each statement's plan.

The fill goes through the engine's own queue functions, batch by batch: ``queue.enqueue``
(the row, its queue group and the per-flow day, week and month counters), ``queue.claim``
(running, leased) and ``queue.complete`` (the outcome with its step results, ~3 log entries
and the per-component counters), so rows, indexes and counters are those a running service
would have. Creation times are spread over ``--days`` (ids embed them, in order); about one
execution in ten fails.

    .venv/bin/python bench/history.py [--database-url postgresql+asyncpg://postgres@127.0.0.1/db] \
        [--executions 100000] [--flows 200] [--tenants 5] [--days 30] [--repeat 20] [--keep DIR] \
        [--reuse] [--ops]

Without --database-url, a temporary SQLite file (kept in DIR with --keep). A PostgreSQL
database must exist and be empty; it is migrated here. ``--reuse`` measures a database an
earlier run filled (``--keep DIR``, or the same --database-url), after migrating it to the
head: a before/after pair on one history without filling it twice. Figures from a busy machine are
indicative only (docs/performance.md: state the host's busy share).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _seed import Capture, create_people, id_at, load_flows, one_line, reload_people

from api import flow_body
from flowyard.api.listing import ListQuery
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.executions import service as executions
from flowyard.flows.models import Flow
from flowyard.iam import service as iam
from flowyard.iam.principal import Principal
from flowyard.logs import append as logs
from flowyard.logs import service as log_service
from flowyard.queue import store as queue
from flowyard.queue.records import Outcome, StepRecord

WORKER = "bench-history"


def _steps(created: datetime, failed: bool) -> list[StepRecord]:
    out = []
    for position, (node, component) in enumerate((("in", "webhook"), ("map", "jsonata"), ("out", "log"))):
        bad = failed and node == "out"
        out.append(
            StepRecord(
                node_id=node,
                component_id=component,
                function=None,
                status="failed" if bad else "succeeded",
                runs=1,
                messages_in=1,
                messages_out=0 if bad else 1,
                duration_ms=1.5,
                started_at=created,
                finished_at=created + timedelta(milliseconds=2),
                error="HTTP 502 from the peer" if bad else None,
                output=None if bad else {"order": position},
                position=position,
                input={"data": {"order": 1}, "metadata": {"source": "webhook"}} if bad else None,
            )
        )
    return out


async def fill(db: Database, args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    async with db.write() as session:
        await iam.create_user(
            session,
            username="bench@example.com",
            password=None,
            firstname="Bench",
            lastname="Admin",
            tenant_id=None,
            permissions=["all"],
        )
    people = await create_people(db, args.tenants, 2)
    flows = await load_flows(db, people, args.flows, flow_body, status_for=lambda _rng: "active", span_days=1)
    rng = random.Random(19)
    now = datetime.now(UTC)
    start = now - timedelta(days=args.days)
    step = (now - start) / max(args.executions, 1)
    made = 0
    while made < args.executions:
        n = min(args.batch, args.executions - made)
        items = []
        for i in range(n):
            flow = flows[rng.randrange(len(flows))]
            created = start + step * (made + i)
            items.append(
                queue.NewExecution(
                    id=id_at(created),
                    flow_id=flow["id"],
                    flow_version=flow["version"],
                    history_version=flow["history_version"],
                    flow_name=flow["name"],
                    tenant=flow["tenant"],
                    owner_user=queue.owner_user_of(flow["owners"]),
                    trigger="webhook",
                    input={"order": made + i},
                    created_at=created,
                )
            )
        async with db.write() as session:
            await queue.enqueue(session, items)
        async with db.write() as session:
            claimed = await queue.claim(session, worker_id=WORKER, limit=n, lease_seconds=600, cap=n)
        outcomes = []
        for c in claimed:
            failed = rng.random() < 0.1
            # What the runner writes (runtime/runner.py): one summary entry per step that ran,
            # its counts in ``data``, and the error entry of a step that failed.
            entries = [
                logs.entry(
                    "error" if failed and node == "out" else "info",
                    f"step {node} failed: HTTP 502 from the peer"
                    if failed and node == "out"
                    else f"step {node} ({component}) ran 1 time(s) in 1.5 ms, 1 message(s) out",
                    tenant=c.tenant,
                    user_id=c.owner_user,
                    flow_id=c.flow_id,
                    execution_id=c.id,
                    step_id=node,
                    component_id=component,
                    timestamp=c.created_at,
                    data=None
                    if failed and node == "out"
                    else {"runs": 1, "attempts": 1, "messagesIn": 1, "messagesOut": 1, "durationMs": 1.5},
                )
                for node, component in (("in", "webhook"), ("map", "jsonata"), ("out", "log"))
            ]
            outcomes.append(
                Outcome(
                    execution_id=c.id,
                    flow_id=c.flow_id,
                    tenant=c.tenant,
                    owner_user=c.owner_user,
                    created_at=c.created_at,
                    status="failed" if failed else "succeeded",
                    result=None if failed else {"ok": True},
                    error="HTTP 502 from the peer" if failed else None,
                    finished_at=c.created_at + timedelta(milliseconds=5),
                    steps=_steps(c.created_at, failed),
                    logs=entries,
                )
            )
        async with db.write() as session:
            await queue.complete(session, outcomes, worker_id=WORKER)
        made += n
        if made % (args.batch * 20) == 0 or made == args.executions:
            print(f"  {made} executions", flush=True)
    return people, flows


def _fmt(times: list[float]) -> str:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return f"p50 {statistics.median(times):7.2f} ms, p99 {p99:7.2f} ms"


async def _plan(db: Database, capture: Capture, statement: str, parameters: Any) -> list[str]:
    """EXPLAIN QUERY PLAN (SQLite) or EXPLAIN (PostgreSQL) of a captured statement."""
    if db.is_sqlite:
        lines, _ms = await capture.explain(statement, parameters, repeat=1)
        return lines
    async with db.engine.connect() as conn:
        return [str(r[0]) for r in (await conn.exec_driver_sql("EXPLAIN " + statement, parameters)).all()]


async def measure(db: Database, args: argparse.Namespace, people: Any, flows: list[dict[str, Any]]) -> None:
    member = people.principal(people.users[0][0], people.tenants[0])
    admin = Principal(people.admin_id, "bench", None, frozenset({"all"}), "")
    fid = next(f["id"] for f in flows if f["tenant"] == people.tenants[0])
    lists: list[tuple[str, Principal, Any]] = []
    for who, principal in (("member", member), ("admin", admin)):
        for label, filters in (
            ("", {}),
            ("status=failed", {"status": "failed"}),
            ("flowId", {"flowId": fid}),
            ("flowId+failed", {"flowId": fid, "status": "failed"}),
        ):
            lists.append((f"{who} GET /executions {label}", principal, ("executions", filters)))
        for label, filters, errors in (
            ("", {}, False),
            ("showErrors", {}, True),
            ("flowId", {"flowId": fid}, False),
            ("stepId=out", {"stepId": "out"}, False),
        ):
            lists.append(
                (
                    f"{who} GET /logs?filter[tenant] {label}",
                    principal,
                    ("logs", {"tenant": people.tenants[0], **filters}, errors),
                )
            )
    capture = Capture(db)
    for name, principal, what in lists:
        for number in (1, 500):
            lq = ListQuery(page=number, size=10, filters=what[1])

            async def call(
                session: Any, lq: ListQuery = lq, principal: Principal = principal, what: Any = what
            ) -> Any:
                if what[0] == "executions":
                    return await executions.list_executions(session, principal, lq)
                return await log_service.query_logs(
                    session, principal, lq, errors_only=what[2], since=None, until=None
                )

            times = []
            result: Any = None
            for _ in range(args.repeat):
                async with db.read() as session:
                    started = time.perf_counter()
                    result = await call(session)
                    times.append((time.perf_counter() - started) * 1000)
            print(f"{name:48} page {number:3}: {_fmt(times)}  total {result[1]} exact {result[2]}")
            if number == 500:
                for statement, parameters in await capture.run(call):
                    print("    " + one_line(statement)[:160])
                    print(
                        "\n".join("      " + line for line in await _plan(db, capture, statement, parameters))
                    )


_HISTORY_TABLES = ("executions", "logs")
_COUNTER_TABLES = ("flow_day_counts", "flow_period_counts", "component_day_counts", "component_period_counts")


async def storage(db: Database) -> dict[str, int]:
    """Bytes on disk: the history's tables with their indexes, the counters with theirs, and
    the whole database (SQLite: the file's used pages; PostgreSQL: the database)."""
    out: dict[str, int] = {}
    async with db.engine.connect() as conn:
        if db.is_sqlite:
            rows: list[Any] = list(
                await conn.exec_driver_sql(
                    "SELECT coalesce(i.tbl_name, d.name), sum(d.pgsize) FROM dbstat AS d "
                    "LEFT JOIN sqlite_schema AS i ON i.name = d.name GROUP BY 1"
                )
            )
            by_table = {str(row[0]): int(row[1]) for row in rows}
            page = int((await conn.exec_driver_sql("PRAGMA page_size")).scalar() or 0)
            pages = int((await conn.exec_driver_sql("PRAGMA page_count")).scalar() or 0)
            free = int((await conn.exec_driver_sql("PRAGMA freelist_count")).scalar() or 0)
            out["database"] = (pages - free) * page
            out["file"] = pages * page
        else:
            by_table = {}
            for name in (*_HISTORY_TABLES, *_COUNTER_TABLES):
                by_table[name] = int(
                    (await conn.exec_driver_sql(f"SELECT pg_total_relation_size('{name}')")).scalar() or 0
                )
            out["database"] = int(
                (await conn.exec_driver_sql("SELECT pg_database_size(current_database())")).scalar() or 0
            )
    for name in _HISTORY_TABLES:
        out[name] = by_table.get(name, 0)
    out["counters"] = sum(by_table.get(name, 0) for name in _COUNTER_TABLES)
    return out


def _mib(n: int) -> str:
    return f"{n / 1048576:,.1f} MiB"


async def ops(db: Database, args: argparse.Namespace, directory: Path | None) -> None:
    """Storage per execution, then (SQLite) ``flowyard backup`` and ``flowyard check`` timed,
    then a first pruning pass of half the history, timed, and what it gave back."""
    from flowyard.config import Settings
    from flowyard.ops import backup as ops_backup
    from flowyard.ops import check as ops_check
    from flowyard.queue import pruner

    async with db.read() as session:
        count = int(await session.scalar(sa.text("SELECT count(*) FROM executions")) or 0)
    sizes = await storage(db)
    per = {k: v / max(1, count) for k, v in sizes.items()}
    print(
        f"storage: {count} executions; database {_mib(sizes['database'])} ({per['database'] / 1024:.2f} KiB "
        f"per execution): executions + indexes {per['executions']:.0f} B, logs + indexes "
        f"{per['logs']:.0f} B, counters {per['counters']:.0f} B per execution"
    )
    settings = Settings(database_url=args.database_url, data_dir=directory or Path(tempfile.gettempdir()))
    if db.is_sqlite and directory is not None:
        target = directory / f"backup-{int(time.time())}"
        started = time.perf_counter()
        made = await asyncio.to_thread(ops_backup.backup, settings, target)
        print(
            f"flowyard backup: {time.perf_counter() - started:.1f} s, {_mib(made.manifest['database']['bytes'])}"
        )
        shutil.rmtree(target, ignore_errors=True)
        started = time.perf_counter()
        report = await ops_check.check(settings)
        print(f"flowyard check: {time.perf_counter() - started:.1f} s, ok {report.ok}")
    retention = timedelta(days=args.days / 2)
    started = time.perf_counter()
    done = await pruner.prune(db, retention=retention, batch=2000)
    print(f"first prune (retention {retention.days} days): {time.perf_counter() - started:.1f} s, {done}")
    after = await storage(db)
    print(
        f"after the prune: database {_mib(after['database'])}"
        + (f", file {_mib(sizes['file'])} -> {_mib(after['file'])}" if "file" in after else "")
    )


async def main(args: argparse.Namespace) -> None:
    tmp = None
    directory: Path | None = None
    if args.database_url is None:
        directory = Path(args.keep) if args.keep else Path(tmp := tempfile.mkdtemp(prefix="history-"))
        directory.mkdir(parents=True, exist_ok=True)
        args.database_url = f"sqlite+aiosqlite:///{(directory / 'flowyard.db').resolve()}"
    await migrate.upgrade_async(args.database_url)
    db = Database(args.database_url)
    try:
        started = time.perf_counter()
        if args.reuse:
            people = await reload_people(db)
            async with db.read() as session:
                rows = (await session.execute(sa.select(Flow.id, Flow.tenant).order_by(Flow.id))).all()
            flows = [{"id": fid, "tenant": tenant} for fid, tenant in rows]
            async with db.read() as session:
                args.executions = int(await session.scalar(sa.text("SELECT count(*) FROM executions")) or 0)
        else:
            people, flows = await fill(db, args)
        # Statistics, and on PostgreSQL the visibility map that autovacuum keeps in steady
        # state (without it no index-only scan is planned on freshly written rows).
        autocommit = db.engine.execution_options(isolation_level="AUTOCOMMIT")
        async with autocommit.connect() as conn:
            await conn.execute(sa.text("ANALYZE" if db.is_sqlite else "VACUUM ANALYZE"))
        print(
            f"{args.executions} executions ({args.flows} flows, {args.tenants} tenants, {args.days} days) "
            f"{'reused' if args.reuse else 'filled'} in {time.perf_counter() - started:.0f} s; "
            f"{db.engine.dialect.name}"
        )
        await measure(db, args, people, flows)
        if args.ops:
            await ops(db, args, directory)
    finally:
        await db.dispose()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", default=None, help="keep the SQLite file in this directory")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure what --keep DIR (or --database-url) already holds, migrated to the head, without filling",
    )
    parser.add_argument(
        "--ops",
        action="store_true",
        help="then storage per execution, backup and check (SQLite), and a first prune of half the days",
    )
    asyncio.run(main(parser.parse_args()))
