"""Flow API reads over a large catalogue: 100,000 flows in 10 tenants, served by
`flowyard serve` on SQLite (or, with --database-url, on an empty PostgreSQL database).

The flows are written straight into the (stopped) server's database through
flows.service.prepare_new_flow (full validation; owners = a user and its tenant)
and Core INSERTs of the same flows + flow_owners rows insert_flows writes,
committed 10,000 at a time. Then, for a tenant member (non-admin: the
visibility path) and for the admin, each of

    GET /flows                                       (default page: id order)
    GET /flows?search=<word>                         (a few percent match)
    GET /flows?filter[status]=active&sort=-updatedAt
    GET /flows/{id}                                  (ids cycle over the member's flows)

runs under 16 keep-alive clients for 10 s. Prints requests/s, p50/p99 latency,
errors, server CPU per request, RSS, and EXPLAIN QUERY PLAN (plus the bare
SQL time) of every statement each request sends.

    .venv/bin/python bench/api.py [--flows 100000] [--tenants 10] [--users 10] \
        [--clients 16] [--seconds 10] [--search shopify] [--analyze] [--keep | --reuse DIR] \
        [--database-url postgresql+asyncpg://postgres@127.0.0.1/db [--reuse-db]]

On PostgreSQL the database must exist and be empty (the server migrates it), or hold what an
earlier run loaded (``--reuse-db``); the query plans are printed on SQLite only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import psutil
import sqlalchemy as sa
from _common import Server, get_request, run_load, summary
from _seed import Capture, People, create_people, database, load_flows, one_line, reload_people

from flowyard.api.listing import ListQuery
from flowyard.db.session import Database
from flowyard.flows import service as flows
from flowyard.flows.models import Flow
from flowyard.iam.principal import Principal

SYSTEMS = [
    "salesforce",
    "sap",
    "shopify",
    "hubspot",
    "zendesk",
    "stripe",
    "netsuite",
    "jira",
    "slack",
    "magento",
    "workday",
    "marketo",
    "dynamics",
    "servicenow",
    "mailchimp",
    "quickbooks",
    "xero",
    "pipedrive",
    "intercom",
    "freshdesk",
    "asana",
    "trello",
    "dropbox",
    "box",
    "gitlab",
    "github",
    "okta",
    "twilio",
    "sendgrid",
    "segment",
    "airtable",
    "notion",
    "klaviyo",
    "braze",
    "adyen",
    "paypal",
    "shipbob",
    "fedex",
    "docusign",
    "gusto",
]
VERBS = [
    "sync",
    "import",
    "export",
    "mirror",
    "notify",
    "enrich",
    "route",
    "archive",
    "reconcile",
    "backfill",
]
OBJECTS = [
    "orders",
    "invoices",
    "contacts",
    "tickets",
    "leads",
    "shipments",
    "payments",
    "products",
    "refunds",
    "subscriptions",
]
TEAMS = [
    "finance",
    "logistics",
    "support",
    "sales",
    "marketing",
    "platform",
    "data",
    "ops",
    "légal",
    "übersee",
]


def flow_body(i: int, rng: random.Random) -> dict[str, Any]:
    verb, obj = rng.choice(VERBS), rng.choice(OBJECTS)
    dst = rng.choice(SYSTEMS)
    body: dict[str, Any] = {
        "name": f"{verb.title()} {obj} to {dst} #{i}",
        "type": rng.choices(("ordinary", "realtime", "long_running"), (75, 20, 5))[0],
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {
                    "id": "map",
                    "componentId": "jsonata",
                    "fields": {"expression": f"$merge([$, {{'n': {i}}}])"},
                },
                {"id": "out", "componentId": rng.choice(("log", "http"))}
                if rng.random() < 0.5
                else {"id": "out", "componentId": "log", "fields": {"level": "info", "message": obj}},
            ],
            "edges": [{"source": "in", "target": "map"}, {"source": "map", "target": "out"}],
        },
    }
    if body["graph"]["nodes"][2]["componentId"] == "http":
        body["graph"]["nodes"][2]["fields"] = {
            "url": f"https://{dst}.example.com/api/{obj}",
            "method": "POST",
        }
    if rng.random() < 0.8:
        body["description"] = (
            f"{verb.title()}s {obj} for the {rng.choice(TEAMS)} team; "
            f"falls back to {rng.choice(SYSTEMS)} when {dst} is down. Reviewed {rng.randint(1, 52)} weeks ago."
        )
    return body


def status_for(rng: random.Random) -> str:
    # Only steady states: the engine of the measured server would otherwise
    # spend the run completing starting/stopping moves.
    return "active" if rng.random() < 0.35 else "inactive"


def queries(search: str) -> list[tuple[str, str, ListQuery | None]]:
    return [
        ("GET /flows", "/flows", ListQuery()),
        (f"GET /flows?search={search}", f"/flows?search={quote(search)}", ListQuery(search=search)),
        (
            "GET /flows?filter[status]=active&sort=-updatedAt",
            "/flows?" + quote("filter[status]") + "=active&sort=-updatedAt",
            ListQuery(sort="-updatedAt", filters={"status": "active"}),
        ),
        ("GET /flows/{id}", "", None),
    ]


def postgres_cpu() -> float:
    """CPU seconds (user + system) of this machine's PostgreSQL processes so far."""
    total = 0.0
    for p in psutil.process_iter(["name", "cpu_times"]):
        if p.info["name"] == "postgres" and p.info["cpu_times"] is not None:
            total += p.info["cpu_times"].user + p.info["cpu_times"].system
    return total


def open_db(args: argparse.Namespace, server: Server) -> Database:
    return Database(args.database_url) if args.database_url else database(server.data_dir)


async def load(args: argparse.Namespace, server: Server) -> tuple[People, list[str]]:
    db = open_db(args, server)
    try:
        started = time.perf_counter()
        people = await create_people(db, args.tenants, args.users)

        def progress(n: int) -> None:
            print(f"  {n} flows ({time.perf_counter() - started:.0f} s)", end="\r", flush=True)

        rows = await load_flows(db, people, args.flows, flow_body, status_for=status_for, progress=progress)
        print()
        analyze = args.analyze or bool(args.database_url)  # PostgreSQL: autovacuum would, later
        if analyze:
            async with db.engine.connect() as conn:
                await conn.exec_driver_sql("ANALYZE")
                await conn.commit()
        member_tenant = people.tenants[0]
        visible = [r["id"] for r in rows if r["tenant"] == member_tenant]
        statuses = {s: sum(r["status"] == s for r in rows) for s in ("active", "inactive")}
        print(
            f"loaded {len(rows)} flows for {len(people.tenants)} tenants x {args.users} users in "
            f"{time.perf_counter() - started:.0f} s (prepare_new_flow + executemany INSERT, 10k per commit); "
            f"{statuses}; member sees {len(visible)}; ANALYZE {'run' if analyze else 'not run (as in production)'}"
        )
        return people, visible
    finally:
        await db.dispose()


async def reload(db: Database) -> tuple[People, list[str]]:
    """People and the member's flows of a database an earlier run loaded (``--keep``, ``--reuse-db``)."""
    try:
        people = await reload_people(db)
        async with db.read() as session:
            visible = (
                await session.execute(
                    sa.select(Flow.id).where(Flow.tenant == people.tenants[0]).order_by(Flow.id)
                )
            ).scalars()
            return people, list(visible)
    finally:
        await db.dispose()


async def explain(args: argparse.Namespace, server: Server, people: People, flow_id: str) -> None:
    db = database(server.data_dir)
    cap = Capture(db)
    member = people.users[0][0]
    callers = {
        "member": people.principal(member, people.tenants[0]),
        "admin": Principal(people.admin_id, "admin", None, frozenset({"all"}), ""),
    }
    try:
        for label, _path, lq in queries(args.search):
            for who, principal in callers.items():

                async def call(
                    session: Any, lq: ListQuery | None = lq, principal: Principal = principal
                ) -> None:
                    if lq is None:
                        await flows.read_flow(db, principal, flow_id)
                    else:
                        await flows.list_flows(db, principal, lq)

                print(f"\n{label} as {who}:")
                for sql, params in await cap.run(call):
                    lines, ms = await cap.explain(sql, params)
                    print(f"  SQL ({ms:.2f} ms alone): {one_line(sql)}")
                    for line in lines:
                        print(f"    {line}")
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--users", type=int, default=10, help="Users per tenant.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--search", default="shopify", help="Search word (a system name: a few percent of flows)."
    )
    parser.add_argument(
        "--analyze", action="store_true", help="Run ANALYZE after loading (flowyard never does)."
    )
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the data directory (it is deleted otherwise)."
    )
    parser.add_argument(
        "--reuse",
        metavar="DIR",
        help="Serve a data directory an earlier run kept (--keep) instead of loading a new one "
        "(loading 100,000 flows takes minutes; before/after runs then read the same rows). Kept.",
    )
    parser.add_argument("--database-url", help="An empty PostgreSQL database to serve from.")
    parser.add_argument(
        "--reuse-db", action="store_true", help="The --database-url holds what an earlier run loaded."
    )
    args = parser.parse_args()

    if args.database_url:
        args.no_explain = True
        server = Server(env_extra={"FLOWYARD_DATABASE_URL": args.database_url})
        server.start()  # migrates and creates the admin
        server.stop()
        if args.reuse_db:
            people, visible = asyncio.run(reload(open_db(args, server)))
        else:
            people, visible = asyncio.run(load(args, server))
    elif args.reuse:
        server = Server(data_dir=Path(args.reuse))
        args.keep = True
        server.start()  # migrates a directory kept by an earlier version to the head
        server.stop()
        people, visible = asyncio.run(reload(open_db(args, server)))
    else:
        server = Server()
        server.start()  # migrates and creates the admin
        server.stop()
        people, visible = asyncio.run(load(args, server))
    if not args.no_explain:
        print("\n== query plans (EXPLAIN QUERY PLAN of each statement the request sends) ==")
        asyncio.run(explain(args, server, people, visible[len(visible) // 2]))

    server.start()
    try:
        callers = {"member": server.login(*people.member(0)), "admin": server.login()}
        print(
            f"\n== {args.clients} clients x {args.seconds:.0f} s each, "
            f"{'PostgreSQL' if args.database_url else 'SQLite'}, engine on; "
            f"server RSS {server.rss() / 2**20:.0f} MiB after start =="
        )
        for label, path, _lq in queries(args.search):
            for who, headers in callers.items():
                if path:
                    make = get_request(lambda i, p=path: p, headers)
                else:
                    make = get_request(lambda i: f"/flows/{visible[i % len(visible)]}", headers)
                probe = httpx.get(server.base + (path or f"/flows/{visible[0]}"), headers=headers, timeout=30)
                probe.raise_for_status()
                meta = orjson.loads(probe.content).get("meta", {})
                selected = f", selects {meta['total']}" if "total" in meta else ""
                run_load(server.port, make, clients=args.clients, seconds=1)  # warm-up
                cpu, pg = server.cpu(), postgres_cpu()
                res = run_load(server.port, make, clients=args.clients, seconds=args.seconds)
                cpu, pg = server.cpu() - cpu, postgres_cpu() - pg
                per = 1000 / max(res.ok, 1)
                print(
                    f"{label} [{who}{selected}]: {res.rate:.0f} req/s, {summary(res.latencies)}; "
                    f"errors {res.errors or 'none'}; CPU {cpu * per:.2f} ms/req"
                    + (f" + PostgreSQL {pg * per:.2f} ms/req" if args.database_url else "")
                    + f"; RSS {server.rss() / 2**20:.0f} MiB"
                )
        print(f"server peak RSS {server.peak_rss / 2**20:.0f} MiB")
    finally:
        server.finish(keep=args.keep)


if __name__ == "__main__":
    main()
