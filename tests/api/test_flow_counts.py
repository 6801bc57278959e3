"""The flow lists' totals come from counts kept with the flows (flows/counts.py, issue 19).
After every write the flows module makes (create one or a batch, change owners or type,
start, each lifecycle move, stop, delete, a refused change), the list's total for a member,
a user without a tenant and an administrator, with each status and type filter, equals the
rule counted from the flows themselves; and the counter rows equal those migration 0022
builds from the same flows. On SQLite and PostgreSQL."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from flowyard.api.listing import ListQuery
from flowyard.components.registry import Registry
from flowyard.db.session import Database
from flowyard.errors import Conflict, InvalidInput
from flowyard.flows import counts
from flowyard.flows import service as flows
from flowyard.flows.models import Flow, FlowCount
from flowyard.flows.status import FlowStatus, move
from flowyard.iam.principal import Principal
from tests.conftest import flow_body

ADMIN = Principal("a" * 24, "admin@example.com", None, frozenset({"all"}), "")
T1, T2 = "1" * 24, "2" * 24
MEMBER = Principal("b" * 24, "m@example.com", T1, frozenset({"tenant.flows.read"}), "")
TENANTLESS = Principal("c" * 24, "t@example.com", None, frozenset({"tenant.flows.read"}), "")
OTHER = "d" * 24
OWNER_SETS = [
    [("user", MEMBER.user_id)],
    [("tenant", T1)],
    [("user", MEMBER.user_id), ("tenant", T1)],
    [("tenant", T2)],
    [("user", OTHER)],
    [("user", OTHER), ("tenant", T1)],
    [("user", TENANTLESS.user_id)],
    [("user", TENANTLESS.user_id), ("user", MEMBER.user_id), ("tenant", T2), ("tenant", T1)],
]
FILTERS: list[dict[str, str]] = [
    {},
    {"status": "active"},
    {"status": "0"},
    {"status": "starting"},
    {"status": "stopping"},
    {"type": "ordinary"},
    {"type": "long_running"},
    {"status": "1", "type": "realtime"},
]
STATUS = {"1": "active", "0": "inactive", "long_running": "realtime"}


def _body(rng: random.Random) -> dict[str, Any]:
    owners = [{"type": t, "id": i} for t, i in rng.choice(OWNER_SETS)]
    return flow_body(f"flow {rng.randrange(1000)}", owners=owners, type=rng.choice(["ordinary", "realtime"]))


def _rule(rows: list[Any], principal: Principal, filters: dict[str, str]) -> int:
    keys = set(principal.owner_keys())
    n = 0
    for row in rows:
        owners = {(o["type"], o["id"]) for o in row.owners}
        if not principal.is_admin and not keys & owners:
            continue
        if "status" in filters and row.status != STATUS.get(filters["status"], filters["status"]):
            continue
        if "type" in filters and row.type != STATUS.get(filters["type"], filters["type"]):
            continue
        n += 1
    return n


async def _check(db: Database, where: str) -> None:
    async with db.read() as session:
        rows = (await session.execute(sa.select(Flow.owners, Flow.status, Flow.type))).all()
        for principal in (MEMBER, TENANTLESS, ADMIN):
            for filters in FILTERS:
                _page, total, _exact = await flows.list_flows(db, principal, ListQuery(filters=filters))
                assert total == _rule(list(rows), principal, filters), (where, principal.username, filters)
        kept = Counter(
            {
                (r.user_id, r.tenant, r.status, r.type): r.n
                for r in (await session.execute(sa.select(FlowCount.__table__))).all()
                if r.n
            }
        )
    assert kept == await _recount(db), where
    async with db.read() as session:
        assert await counts.drift(session) == {}, where  # what `flowyard check` compares


async def _recount(db: Database) -> Counter[tuple[str, str, str, str]]:
    """The counter rows as migration 0022 fills them, from flows and flow_owners."""
    from importlib import import_module

    fill = import_module("flowyard.db.migrations.versions.20261207_0022_flow_counts")._FILL
    select = fill.strip().removeprefix("INSERT INTO flow_counts (user_id, tenant, status, type, n)")
    async with db.read() as session:
        rows = (await session.execute(sa.text(select))).all()
    return Counter({(u, t, s, ty): n for u, t, s, ty, n in rows})


async def test_totals_follow_every_write(db: Database, registry: Registry) -> None:
    rng = random.Random(19)
    ids: list[str] = []
    # A batch (one statement's worth of counts) and single creates.
    async with db.write() as session:
        batch = [flows.prepare_new_flow(ADMIN, _body(rng), registry) for _ in range(12)]
        await flows.insert_flows(session, batch)
    ids += [f.id for f in batch]
    await _check(db, "batch")
    for step in range(80):
        op = rng.choice(["create", "patch", "start", "start", "move", "move", "stop", "delete", "delete"])
        async with db.read() as session:
            status = dict((await session.execute(sa.select(Flow.id, Flow.status))).all())
        # Mostly a flow the write applies to (so every status is reached), now and then any.
        wanted = {"start": {"inactive"}, "move": {"starting", "stopping"}, "stop": {"active"}}.get(op)
        fits = [i for i in ids if wanted is None or status[i] in wanted]
        flow_id = rng.choice(fits if fits and rng.random() < 0.85 else ids) if ids else None
        async with db.write() as session:
            current = await session.get(Flow, flow_id) if flow_id else None
            try:
                if op == "create" or current is None:
                    made = flows.prepare_new_flow(ADMIN, _body(rng), registry)
                    await flows.insert_flows(session, [made])
                    ids.append(made.id)
                elif op == "patch":
                    body = _body(rng)
                    await flows.update_flow(
                        session, ADMIN, current.id, {"owners": body["owners"], "type": body["type"]}, registry
                    )
                elif op == "start":
                    await flows.transition(
                        session,
                        ADMIN,
                        current.id,
                        expected=FlowStatus.INACTIVE,
                        target=FlowStatus.STARTING,
                        registry=registry,
                    )
                elif op == "stop":
                    await flows.transition(
                        session, ADMIN, current.id, expected=FlowStatus.ACTIVE, target=FlowStatus.STOPPING
                    )
                elif op == "move":
                    frm = FlowStatus(current.status)
                    to = {
                        FlowStatus.STARTING: rng.choice([FlowStatus.ACTIVE, FlowStatus.INACTIVE]),
                        FlowStatus.STOPPING: FlowStatus.INACTIVE,
                    }.get(frm)
                    if to is not None:
                        assert await move(session, current.id, frm, to, at=current.status_changed_at)
                    else:  # a move from a status the flow is not in moves nothing, counts included
                        assert not await move(
                            session,
                            current.id,
                            FlowStatus.STOPPING,
                            FlowStatus.INACTIVE,
                            at=current.status_changed_at,
                        )
                else:
                    await flows.delete_flow(session, ADMIN, current.id)
                    ids.remove(current.id)
            except (Conflict, InvalidInput):
                pass  # refused (a delete of a started flow, a patch while starting): nothing moves
        await _check(db, f"step {step}: {op}")


async def test_a_rolled_back_write_is_not_counted(db: Database, registry: Registry) -> None:
    before = await _recount(db)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with db.write() as session:
            made = flows.prepare_new_flow(
                ADMIN, flow_body("gone", owners=[{"type": "tenant", "id": T1}]), registry
            )
            await flows.insert_flows(session, [made])
            raise Boom
    await _check(db, "rolled back")
    assert await _recount(db) == before


async def test_a_flow_whose_owners_cell_was_quarantined_is_still_counted_right(
    db: Database, registry: Registry
) -> None:
    """Poison: ``flowyard check --quarantine`` may replace a flow's ``owners`` JSON with a JSON
    string. The counts follow ``flow_owners`` (the visibility index), so every move of that
    flow and its deletion keep them true, and the good flows beside it are unaffected."""
    async with db.write() as session:
        good = flows.prepare_new_flow(
            ADMIN, flow_body("good", owners=[{"type": "tenant", "id": T1}]), registry
        )
        bad = flows.prepare_new_flow(ADMIN, flow_body("bad", owners=[{"type": "tenant", "id": T1}]), registry)
        await flows.insert_flows(session, [good, bad])
    async with db.write() as session:
        await session.execute(
            sa.text("""UPDATE flows SET owners = '"[{broken"' WHERE id = :i"""), {"i": bad.id}
        )

    async def member_totals() -> tuple[int, int]:
        async with db.read() as session:
            assert await counts.drift(session) == {}
            every = (await flows.list_flows(db, MEMBER, ListQuery()))[1]
            active = (await flows.list_flows(db, MEMBER, ListQuery(filters={"status": "active"})))[1]
            return every, active

    assert await member_totals() == (2, 0)
    with pytest.raises(Conflict, match="owners: must be an array"):  # such a flow cannot start
        async with db.write() as session:
            await flows.transition(
                session,
                ADMIN,
                bad.id,
                expected=FlowStatus.INACTIVE,
                target=FlowStatus.STARTING,
                registry=registry,
            )
    assert await member_totals() == (2, 0)
    async with db.write() as session:  # but it may be in transit already: the moves still count it
        assert await move(session, bad.id, FlowStatus.INACTIVE, FlowStatus.STARTING, at=good.created_at)
    async with db.write() as session:
        assert await move(session, bad.id, FlowStatus.STARTING, FlowStatus.ACTIVE, at=good.created_at)
    assert await member_totals() == (2, 1)
    async with db.write() as session:
        await flows.transition(session, ADMIN, bad.id, expected=FlowStatus.ACTIVE, target=FlowStatus.STOPPING)
    async with db.write() as session:
        assert await move(session, bad.id, FlowStatus.STOPPING, FlowStatus.INACTIVE, at=good.created_at)
    assert await member_totals() == (2, 0)
    async with db.write() as session:
        await flows.delete_flow(session, ADMIN, bad.id)
    assert await member_totals() == (1, 0)
