"""Bulk seeding for the benches: tenants, users and flows written straight into
a stopped server's database through flowyard's own services and models (the
HTTP API would take far too long for 100,000 flows), plus ``EXPLAIN QUERY
PLAN`` helpers."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.flows import counts, history
from flowyard.flows import service as flows
from flowyard.flows.models import Flow, FlowOwner
from flowyard.iam import permissions as perms
from flowyard.iam import service as iam
from flowyard.iam.models import Tenant, User
from flowyard.iam.principal import Principal

MEMBER_PASSWORD = "bench member password 123"
MEMBER_PERMISSIONS = (perms.FLOWS_READ, perms.FLOWS_CREATE, perms.FLOWS_UPDATE, perms.FLOWS_DELETE)

# Flow columns that prepare_new_flow sets, written as Core rows.
_FLOW_COLUMNS = [c.key for c in Flow.__table__.columns]


def database(data_dir: Path) -> Database:
    return Database(f"sqlite+aiosqlite:///{(data_dir / 'flowyard.db').resolve()}")


def id_at(when: datetime) -> str:
    """A flowyard id (ids.new_id) minted at ``when``: ids stay in creation order."""
    return int(when.timestamp()).to_bytes(4, "big").hex() + os.urandom(8).hex()


@dataclass
class People:
    tenants: list[str] = field(default_factory=list)
    # users[t] = user ids of tenant t; users[t][0] is the member the benches log in as.
    users: list[list[str]] = field(default_factory=list)
    usernames: dict[str, str] = field(default_factory=dict)
    admin_id: str = ""

    def member(self, tenant: int = 0) -> tuple[str, str]:
        uid = self.users[tenant][0]
        return self.usernames[uid], MEMBER_PASSWORD

    def principal(self, user_id: str, tenant_id: str | None) -> Principal:
        return Principal(
            user_id, self.usernames.get(user_id, ""), tenant_id, frozenset(MEMBER_PERMISSIONS), ""
        )


async def reload_people(db: Database) -> People:
    """The people of a data directory an earlier run kept (``--keep``), as create_people made them."""
    async with db.read() as session:
        admin = await session.scalar(sa.select(User.id).where(User.username.like("bench@%")))
        tenants = (await session.execute(sa.select(Tenant.id).order_by(Tenant.name))).scalars().all()
        people = People(tenants=list(tenants), admin_id=str(admin))
        for tid in tenants:
            users = (
                await session.execute(
                    sa.select(User.id, User.username).where(User.tenant_id == tid).order_by(User.username)
                )
            ).all()
            people.users.append([u for u, _ in users])
            people.usernames.update(dict(users))
    return people


async def create_people(db: Database, tenants: int, users_per_tenant: int) -> People:
    """Tenants and users through iam.service (as the CLI does); one member per tenant can log in."""
    people = People()
    async with db.write() as session:
        people.admin_id = str(
            await session.scalar(sa.select(iam.User.id).where(iam.User.username.like("bench@%")))
        )
        for t in range(tenants):
            tenant = await iam.create_tenant(session, f"tenant-{t:02d}")
            people.tenants.append(tenant.id)
            ids = []
            for u in range(users_per_tenant):
                user = await iam.create_user(
                    session,
                    username=f"user{u:03d}@tenant-{t:02d}.example.com",
                    # Hashing is deliberately slow: only the member who logs in gets a password.
                    password=MEMBER_PASSWORD if u == 0 else None,
                    firstname=f"User {u}",
                    lastname=f"Tenant {t}",
                    tenant_id=tenant.id,
                    permissions=MEMBER_PERMISSIONS,
                )
                ids.append(user.id)
                people.usernames[user.id] = user.username
            people.users.append(ids)
    return people


def flow_row(flow: Flow) -> dict[str, Any]:
    return {key: getattr(flow, key) for key in _FLOW_COLUMNS}


async def insert_flow_rows(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """The rows insert_flows writes (flows + flow_owners), as two executemany INSERTs."""
    await session.execute(sa.insert(Flow.__table__), list(rows))
    await session.execute(
        sa.insert(FlowOwner.__table__),
        [
            {"flow_id": r["id"], "owner_type": o["type"], "owner_id": o["id"]}
            for r in rows
            for o in r["owners"]
        ],
    )


async def load_flows(
    db: Database,
    people: People,
    count: int,
    body_for: Callable[[int, random.Random], dict[str, Any]],
    *,
    status_for: Callable[[random.Random], str],
    batch: int = 10_000,
    seed: int = 1,
    span_days: int = 365,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """``count`` flows round-robin over every tenant's users, built by flows.service.prepare_new_flow
    (full validation, owners = the user and its tenant) and backdated over ``span_days``."""
    rng = random.Random(seed)
    registry = Registry.load()
    owners = [
        (people.principal(uid, tid), tid)
        for tid, uids in zip(people.tenants, people.users, strict=True)
        for uid in uids
    ]
    now = datetime.now(UTC)
    start = now - timedelta(days=span_days)
    # Creation times in increasing order, so ids (which embed them) are in creation order too.
    created = sorted(start + timedelta(seconds=rng.uniform(0, span_days * 86400)) for _ in range(count))
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    pending_flows: list[Flow] = []
    for i in range(count):
        principal, _tid = owners[rng.randrange(len(owners))]
        flow = flows.prepare_new_flow(principal, body_for(i, rng), registry)
        made = created[i]
        flow.id = id_at(made)
        flow.created_at = made
        flow.updated_at = made + timedelta(seconds=rng.uniform(0, (now - made).total_seconds()))
        flow.status = status_for(rng)
        flow.status_changed_at = flow.updated_at
        flow.history_version = 1  # as flows.service.insert_flows does, with its version 1 below
        pending.append(flow_row(flow))
        pending_flows.append(flow)
        if len(pending) >= batch or i == count - 1:
            async with db.write() as session:
                await insert_flow_rows(session, pending)
                await counts.shift(session, after=[counts.Shape.new(f) for f in pending_flows])
                await history.record_first(session, pending_flows)
            out.extend(pending)
            pending, pending_flows = [], []
            if progress:
                progress(len(out))
    return out


# -- query plans --------------------------------------------------------------------


class Capture:
    """Records the SQL (and parameters) a service call sends, to EXPLAIN and time it afterwards."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.statements: list[tuple[str, Any]] = []
        event.listen(db.engine.sync_engine, "before_cursor_execute", self._on)
        self.on = False
        # Reads straight on the driver (db/fast.py) pass no SQLAlchemy event: recorded here.
        driver_rows = db.driver_rows

        async def recorded(sql: str, args: list[Any], *, inline: bool) -> list[Any]:
            if self.on:
                self.statements.append((sql, args))
            return await driver_rows(sql, args, inline=inline)

        db.driver_rows = recorded  # type: ignore[method-assign]

    def _on(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if self.on and not statement.startswith(("BEGIN", "EXPLAIN", "PRAGMA")):
            self.statements.append((statement, parameters))

    async def run(self, call: Callable[[AsyncSession], Any]) -> list[tuple[str, Any]]:
        self.statements = []
        async with self.db.read() as session:
            self.on = True
            try:
                await call(session)
            finally:
                self.on = False
        return list(self.statements)

    async def explain(self, statement: str, parameters: Any, repeat: int = 20) -> tuple[list[str], float]:
        """EXPLAIN QUERY PLAN lines and the median time of the statement itself (ms)."""
        async with self.db.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            cur = await raw.driver_connection.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            rows = await cur.fetchall()
            depth: dict[int, int] = {0: -1}
            lines = []
            for node, parent, _unused, detail in rows:
                depth[node] = depth.get(parent, -1) + 1
                lines.append("  " * depth[node] + detail)
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                cur = await raw.driver_connection.execute(statement, parameters)
                await cur.fetchall()
                times.append(time.perf_counter() - started)
            times.sort()
        return lines, times[len(times) // 2] * 1000


def one_line(sql: str) -> str:
    return " ".join(sql.split())
