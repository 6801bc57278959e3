"""Property, through the HTTP API: after any sequence of creates (one or a batch), changes of
owners and type, starts, lifecycle moves, stops and deletes (refused ones included), every
flow list's ``meta.total`` — for a tenant member, a user without a tenant and an
administrator, with each status and type filter — equals the rule counted from the flows as
``GET /flows/{id}`` shows them, and ``flowyard check``'s comparison finds nothing. On SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowyard.app import create_app
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.flows import counts
from flowyard.flows.status import FlowStatus, move
from flowyard.iam import passwords
from tests.conftest import Factory, flow_body, truncate

OWNER_SETS = ["member", "tenant", "member+tenant", "other tenant", "loner", "loner+tenant", "nobody else"]
FILTERS = [
    "",
    "filter[status]=active",
    "filter[status]=0",
    "filter[status]=starting",
    "filter[type]=realtime",
    "filter[type]=ordinary&filter[status]=stopping",
]
STATUS = {"active": "active", "0": "inactive", "starting": "starting", "stopping": "stopping"}

op = st.one_of(
    st.tuples(
        st.just("create"),
        st.lists(st.sampled_from(OWNER_SETS), min_size=1, max_size=3),
        st.sampled_from(["ordinary", "realtime"]),
    ),
    st.tuples(
        st.just("patch"),
        st.integers(0, 20),
        st.sampled_from(OWNER_SETS),
        st.sampled_from(["ordinary", "realtime"]),
    ),
    st.tuples(
        st.sampled_from(["start", "stop", "delete", "runnable", "cannot run", "drained"]), st.integers(0, 20)
    ),
)


@pytest.fixture
def cheap_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(op, min_size=1, max_size=14))
def test_list_totals_equal_the_rule_after_any_writes(
    db_url: str,
    registry: Registry,
    cheap_hashing: None,
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[Any],
) -> None:
    asyncio.run(_run(db_url, registry, tmp_path_factory.mktemp("counts"), ops))


async def _run(db_url: str, registry: Registry, data: Any, ops: list[Any]) -> None:
    db = Database(db_url)
    try:
        await truncate(db)
        factory = Factory(db)
        t1, t2 = await factory.tenant(), await factory.tenant()
        admin = await factory.admin()
        member = await factory.user(tenant=t1)
        loner = await factory.user()
        entries = {
            "member": [{"type": "user", "id": member.id}],
            "tenant": [{"type": "tenant", "id": t1}],
            "member+tenant": [{"type": "user", "id": member.id}, {"type": "tenant", "id": t1}],
            "other tenant": [{"type": "tenant", "id": t2}],
            "loner": [{"type": "user", "id": loner.id}],
            "loner+tenant": [{"type": "user", "id": loner.id}, {"type": "tenant", "id": t1}],
            "nobody else": [],
        }
        app = create_app(
            Settings(data_dir=data, database_url=db_url), db=db, registry=registry, run_engine=False
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            ids: list[str] = []
            for step in ops:
                kind, pick = step[0], step[1]
                if kind == "create":
                    bodies = [flow_body("f", owners=entries[o], type=step[2]) for o in pick]
                    r = await c.post(
                        "/flows", json=bodies if len(bodies) > 1 else bodies[0], headers=admin.headers
                    )
                    assert r.status_code == 201, r.text
                    made = r.json()["data"]
                    ids += [f["id"] for f in (made if isinstance(made, list) else [made])]
                    continue
                if not ids:
                    continue
                fid = ids[pick % len(ids)]
                if kind == "patch":
                    r = await c.patch(
                        f"/flows/{fid}",
                        json={"owners": entries[step[2]], "type": step[3]},
                        headers=admin.headers,
                    )
                elif kind in ("start", "stop"):
                    r = await c.post(f"/flows/{fid}/{kind}", headers=admin.headers)
                elif kind == "delete":
                    r = await c.delete(f"/flows/{fid}", headers=admin.headers)
                    if r.status_code == 200:
                        ids.remove(fid)
                else:  # the lifecycle's moves (no engine runs here)
                    frm, to = {
                        "runnable": (FlowStatus.STARTING, FlowStatus.ACTIVE),
                        "cannot run": (FlowStatus.STARTING, FlowStatus.INACTIVE),
                        "drained": (FlowStatus.STOPPING, FlowStatus.INACTIVE),
                    }[kind]
                    async with db.write() as session:
                        await move(session, fid, frm, to, at=utcnow())
                    continue
                assert r.status_code in (200, 409), r.text  # a refused write changes nothing
            shown = [(await c.get(f"/flows/{i}", headers=admin.headers)).json()["data"] for i in ids]
            for who, keys in (
                (admin, None),
                (member, {("user", member.id), ("tenant", t1)}),
                (loner, {("user", loner.id)}),
            ):
                for query in FILTERS:
                    r = await c.get(f"/flows?{query}", headers=who.headers)
                    assert r.status_code == 200, r.text
                    expected = [
                        f
                        for f in shown
                        if (keys is None or keys & {(o["type"], o["id"]) for o in f["owners"]})
                        and all(_holds(f, cond) for cond in query.split("&") if cond)
                    ]
                    assert r.json()["meta"]["total"] == len(expected), (who.username, query, ops)
        async with db.read() as session:
            assert await counts.drift(session) == {}
    finally:
        await db.dispose()


def _holds(flow: dict[str, Any], cond: str) -> bool:
    name, value = cond.split("=")
    if name == "filter[status]":
        return bool(flow["status"] == STATUS[value])
    return bool(flow["type"] == value)
