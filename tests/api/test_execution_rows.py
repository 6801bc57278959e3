"""What an execution row stores (issue 19, storage; migration 0026): on SQLite its ids (not the
flow's) are 12 bytes and its times integers, it keeps no queue group once finished, and a log
entry's message is packed; everything reads back through the API as it was written, and every
caller still sees exactly its own executions, on both databases."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowyard.clock import utcnow
from flowyard.db.packed import UNREADABLE_TEXT
from flowyard.db.session import Database
from flowyard.ids import new_id
from flowyard.logs import append as logs
from flowyard.logs.models import LogEntry
from flowyard.queue import store as queue
from flowyard.queue.models import Execution
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_engine_e2e import active_flow, finished
from tests.engine.test_heartbeat import _outcome


async def _cells(db: Database, eid: str) -> dict[str, Any]:
    """SQLite: an execution's stored cells by type (and the queue group as it is)."""
    async with db.engine.connect() as conn:
        row = (
            await conn.exec_driver_sql(
                "SELECT typeof(id), length(id), typeof(flow_id), typeof(tenant), typeof(owner_user), "
                "typeof(created_at), typeof(started_at), typeof(finished_at), queue_group "
                "FROM executions WHERE id = ?",
                (bytes.fromhex(eid),),
            )
        ).one()
    keys = ("id", "id_length", "flow_id", "tenant", "owner_user", "created", "started", "finished", "group")
    return dict(zip(keys, row, strict=True))


async def _group(db: Database, eid: str) -> str | None:
    async with db.read() as session:
        return await session.scalar(sa.select(Execution.queue_group).where(Execution.id == eid))


async def test_a_finished_execution_is_stored_compactly_and_served_as_it_ran(
    engine_client: httpx.AsyncClient, db: Database, factory: Factory
) -> None:
    c = engine_client
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    stranger = await factory.user(tenant=await factory.tenant())
    fid = await active_flow(c, member, flow_body())
    r = await c.post(f"/webhooks/{fid}", json={"n": 1})
    assert r.status_code == 202, r.text
    eid = r.json()["data"]["executionId"]
    e = await finished(c, member, eid)
    assert e["status"] == "succeeded", e
    assert (e["id"], e["flowId"], e["tenant"], e["user"]) == (eid, fid, tenant, member.id)
    assert e["createdAt"] <= e["startedAt"] <= e["finishedAt"]
    # The list and the one execution agree to the microsecond.
    page = (await c.get("/executions", headers=member.headers)).json()
    # One part for the member's tenant: its recorded tenant read back as text, not as bytes
    # (a second, overlapping part would count the execution twice).
    assert page["meta"]["total"] == 1
    listed = page["data"]
    assert [x["id"] for x in listed] == [eid]
    assert {k: listed[0][k] for k in ("createdAt", "startedAt", "finishedAt", "tenant", "user")} == {
        k: e[k] for k in ("createdAt", "startedAt", "finishedAt", "tenant", "user")
    }
    # A member of another tenant sees none of it.
    assert (await c.get(f"/executions/{eid}", headers=stranger.headers)).status_code == 404
    assert (await c.get("/executions", headers=stranger.headers)).json()["data"] == []
    assert await _group(db, eid) is None  # finished: out of the queue
    if db.is_sqlite:
        assert await _cells(db, eid) == {
            "id": "blob",
            "id_length": 12,
            "flow_id": "text",  # compared with flows.id and flow_owners in SQL: text
            "tenant": "blob",
            "owner_user": "blob",
            "created": "integer",
            "started": "integer",
            "finished": "integer",
            "group": None,
        }
    # Its step summaries are stored packed and served as the runner wrote them.
    r = await c.get(
        "/logs", params={"filter[tenant]": tenant, "filter[executionId]": eid}, headers=member.headers
    )
    assert r.status_code == 200, r.text
    messages = [x["message"] for x in r.json()["data"]]
    # The log component's own entry ("message"), and the runner's summary of each step.
    assert messages[-1] == "message"
    assert [m.split(" ran 1 time(s) in ")[0] for m in messages[:-1]] == [
        "step out (log)",
        "step in (webhook)",
    ]
    if db.is_sqlite:
        async with db.engine.connect() as conn:
            kinds = await conn.exec_driver_sql(
                "SELECT typeof(message) FROM logs WHERE execution_id = ? ORDER BY id DESC",
                (bytes.fromhex(eid),),
            )
            # Packed where that is shorter: the summaries; the short entry stays text.
            assert list(kinds.scalars()) == ["blob", "blob", "text"]


async def test_the_queue_group_is_kept_until_the_execution_finishes(db: Database) -> None:
    """Queued and running rows keep their fair-share group (the claim reads it); a finished one
    does not, whichever way it finished; a cancelled waiting one neither."""
    flow = new_id()
    items = [
        queue.NewExecution(
            id=new_id(),
            flow_id=flow,
            flow_version=1,
            history_version=1,
            flow_name="f",
            tenant="t1",
            owner_user="u1",
            trigger="manual",
            input={"i": i},
            created_at=utcnow(),
        )
        for i in range(4)
    ]
    async with db.write() as session:
        ids = await queue.enqueue(session, items)
    assert [await _group(db, i) for i in ids] == ["t:t1"] * 4
    async with db.write() as session:
        claimed = await queue.claim(session, worker_id="w", limit=3, lease_seconds=60, cap=0)
    running = [x.id for x in claimed]
    assert [await _group(db, i) for i in running] == ["t:t1"] * 3
    async with db.write() as session:
        assert await queue.cancel(session, running[0], "by test") is not None
        assert await queue.cancel(session, ids[3], "by test") is not None  # still queued
    assert await _group(db, running[0]) is None and await _group(db, ids[3]) is None
    assert await _group(db, running[1]) == "t:t1"
    # Outcomes, each row's own status bound in one executemany: a failed and a succeeded one.
    outcomes = [
        replace(_outcome(c), status=st, error=err)
        for c, st, err in zip(claimed[1:], ("failed", "succeeded"), ("boom\x00", None), strict=True)
    ]
    async with db.write() as session:
        await queue.complete(session, outcomes, worker_id="w")
    assert [await _group(db, i) for i in running[1:]] == [None, None]
    async with db.read() as session:
        got = dict(
            (
                await session.execute(
                    sa.select(Execution.id, Execution.status).where(Execution.id.in_(running))
                )
            ).all()
        )
    assert [got[i] for i in running] == ["cancelled", "failed", "succeeded"]
    # The failure's text kept, its NUL as U+FFFD (db.base.QuotedText: PostgreSQL's text refused
    # the whole outcome for it).
    async with db.read() as session:
        error = await session.scalar(sa.select(Execution.error).where(Execution.id == running[1]))
    assert error == "boom\ufffd"


# Any text, and text around the engine's phrases (which packs: db/packed.py's dictionary).
PHRASES = ("step ", " (http) ran 1 time(s) in 0.0 ms, 1 message(s) out", " failed: ", "execution ")
TEXT = st.text(max_size=300) | st.builds(
    lambda a, p, b: a + p + b, st.text(max_size=30), st.sampled_from(PHRASES), st.text(max_size=30)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(TEXT, min_size=1, max_size=5))
async def test_any_message_reads_back_through_the_api(
    client: httpx.AsyncClient, db: Database, admin: Account, messages: list[str]
) -> None:
    """A batch of entries with any message text (packed or not, as it comes out shorter) is
    served back as written, newest first (a NUL character as U+FFFD: db.base.QuotedText)."""
    tenant = new_id()
    async with db.write() as session:
        await logs.append(
            session, [logs.entry("info", m, tenant=tenant, user_id=None, flow_id=new_id()) for m in messages]
        )
    r = await client.get("/logs", params={"filter[tenant]": tenant}, headers=admin.headers)
    assert r.status_code == 200, r.text
    assert [e["message"] for e in reversed(r.json()["data"])] == [
        m.replace("\x00", "\ufffd") for m in messages
    ]


async def test_a_message_that_cannot_be_read_fails_alone(
    client: httpx.AsyncClient, db: Database, admin: Account
) -> None:
    """A stored message BLOB broken outside the service (a bad disk, a raw write) is served as a
    placeholder; the entries beside it read as written."""
    tenant = new_id()
    summary = "step out (log) ran 1 time(s) in 1.5 ms, 1 message(s) out"
    async with db.write() as session:
        await logs.append(
            session,
            [logs.entry("info", summary, tenant=tenant, user_id=None, flow_id=None) for _ in range(3)],
        )
        ids = (await session.scalars(sa.select(LogEntry.id).order_by(LogEntry.id))).all()[-3:]
        if db.is_sqlite:
            await session.execute(
                sa.text("UPDATE logs SET message = :m WHERE id = :i"), {"m": b"\x01\xff\xfe", "i": ids[1]}
            )
    r = await client.get("/logs", params={"filter[tenant]": tenant}, headers=admin.headers)
    assert r.status_code == 200, r.text
    served = [e["message"] for e in reversed(r.json()["data"])]
    assert served == [summary, UNREADABLE_TEXT if db.is_sqlite else summary, summary]
