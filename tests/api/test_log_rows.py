"""What a log row stores (issue 19, storage): an entry of a tenant does not repeat the flow's
user owner (its only reader is a tenantless caller's scope), an entry of no tenant keeps it;
``data`` is packed on SQLite and reads back the same; every caller still reads exactly its own
entries, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowyard.clock import isoformat
from flowyard.db.session import Database
from flowyard.ids import new_id
from flowyard.logs import append as logs
from flowyard.logs.models import LogEntry
from tests.conftest import Account, Factory

US = timedelta(microseconds=1)
DATA = {"runs": 2, "attempts": 3, "messagesIn": 2, "messagesOut": 1, "durationMs": 12.345, "ü": ["ß", None]}


async def _write(db: Database, entries: list[dict[str, Any]]) -> None:
    async with db.write() as session:
        await logs.append(session, entries)


async def _stored(db: Database, flow_id: str) -> list[tuple[Any, ...]]:
    """The rows of a flow's entries, read through the model: (tenant, user, data)."""
    async with db.read() as session:
        rows = await session.execute(
            sa.select(LogEntry.tenant, LogEntry.user_id, LogEntry.data)
            .where(LogEntry.flow_id == flow_id)
            .order_by(LogEntry.id)
        )
        return [tuple(r) for r in rows]


async def _cells(db: Database) -> list[tuple[Any, ...]]:
    """SQLite: each row's stored cells as they are, by type."""
    async with db.engine.connect() as conn:
        rows = await conn.exec_driver_sql(
            "SELECT typeof(timestamp), typeof(tenant), typeof(user_id), typeof(flow_id), "
            "typeof(execution_id), typeof(data), length(tenant), length(flow_id) FROM logs ORDER BY id"
        )
        return [tuple(r) for r in rows]


async def _read(client: httpx.AsyncClient, who: Account, named: str) -> list[dict[str, Any]]:
    r = await client.get("/logs", params={"filter[tenant]": named}, headers=who.headers)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


async def test_a_tenants_entry_stores_no_user_and_each_caller_reads_its_own(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account
) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)
    loner = await factory.user()  # no tenant
    other = await factory.user()  # no tenant either: must not read the loner's entries
    tenant_flow, loner_flow = new_id(), new_id()
    await _write(
        db,
        [
            logs.entry(
                "info", "of the tenant", tenant=tenant, user_id=member.id, flow_id=tenant_flow, data=DATA
            ),
            logs.entry("info", "of the loner", tenant=None, user_id=loner.id, flow_id=loner_flow, data=DATA),
        ],
    )
    # Stored: the tenant's entry without its user, the loner's with it.
    assert [row[:2] for row in await _stored(db, tenant_flow)] == [(tenant, None)]
    assert [row[:2] for row in await _stored(db, loner_flow)] == [(None, loner.id)]
    assert [row[2] for row in await _stored(db, tenant_flow)] == [DATA]
    if db.is_sqlite:
        # The time an integer, the ids their 12 bytes, the data packed (not the JSON text).
        assert await _cells(db) == [
            ("integer", "blob", "null", "blob", "null", "blob", 12, 12),
            ("integer", "null", "blob", "blob", "null", "blob", None, 12),
        ]

    (mine,) = await _read(client, member, tenant)
    assert (mine["message"], mine["tenant"], mine["flowId"], mine["data"]) == (
        "of the tenant",
        tenant,
        tenant_flow,
        DATA,
    )
    (own,) = await _read(client, loner, loner.id)
    assert (own["message"], own["tenant"], own["data"]) == ("of the loner", None, DATA)
    assert await _read(client, other, other.id) == []
    # An administrator names the loner (a user) or the tenant and reads each one's entry only.
    assert [e["message"] for e in await _read(client, admin, loner.id)] == ["of the loner"]
    assert [e["message"] for e in await _read(client, admin, tenant)] == ["of the tenant"]
    # Neither may name the other's scope.
    r = await client.get("/logs", params={"filter[tenant]": loner.id}, headers=member.headers)
    assert r.status_code == 403
    r = await client.get("/logs", params={"filter[tenant]": tenant}, headers=loner.headers)
    assert r.status_code == 403


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(JSON, min_size=1, max_size=4))
async def test_any_data_reads_back_through_the_api(
    client: httpx.AsyncClient, db: Database, factory: Factory, admin: Account, values: list[Any]
) -> None:
    """A batch of entries with any JSON ``data`` (one of them the poison of none: every value
    is valid) is stored and served back as written, newest first."""
    tenant = new_id()
    await _write(
        db,
        [
            logs.entry("info", f"entry {i}", tenant=tenant, user_id=admin.id, flow_id=new_id(), data=v)
            for i, v in enumerate(values)
        ],
    )
    served = await _read(client, admin, tenant)
    assert [e["data"] for e in reversed(served)] == values


async def test_ids_of_another_form_are_stored_as_they_are_and_found(
    client: httpx.AsyncClient, db: Database, admin: Account
) -> None:
    """Only an id of flowyard's form (24 lowercase hex digits) is stored as bytes: one in
    capitals, or of another length, stays text, reads back unchanged and is told apart from
    the lowercase one in filters."""
    tenant = new_id()
    lower = new_id()
    upper = lower.upper()
    await _write(
        db,
        [
            logs.entry("info", "lower", tenant=tenant, user_id=None, flow_id=lower, execution_id=lower),
            logs.entry("info", "upper", tenant=tenant, user_id=None, flow_id=upper, execution_id="e-1"),
        ],
    )
    served = await _read(client, admin, tenant)
    assert [(e["message"], e["flowId"], e["executionId"]) for e in served] == [
        ("upper", upper, "e-1"),
        ("lower", lower, lower),
    ]
    # (the API takes lowercase ids only in filters: the capitals' entry is not the lowercase's)
    r = await client.get(
        "/logs", params={"filter[tenant]": tenant, "filter[flowId]": lower}, headers=admin.headers
    )
    assert r.status_code == 200, r.text
    assert [e["message"] for e in r.json()["data"]] == ["lower"]
    r = await client.get(
        "/logs", params={"filter[tenant]": tenant, "filter[executionId]": lower}, headers=admin.headers
    )
    assert [e["message"] for e in r.json()["data"]] == ["lower"]
    if db.is_sqlite:
        assert [c[3] for c in await _cells(db)] == ["blob", "text"]


async def test_from_and_to_select_by_time_to_the_microsecond(
    client: httpx.AsyncClient, db: Database, admin: Account
) -> None:
    tenant = new_id()
    base = datetime(2026, 12, 7, 12, 0, 0, 500_000, tzinfo=UTC)
    await _write(
        db,
        [
            logs.entry("info", f"at {i}", tenant=tenant, user_id=None, flow_id=None, timestamp=base + i * US)
            for i in range(3)
        ],
    )

    async def between(start: datetime | None, end: datetime | None) -> list[str]:
        params = {"filter[tenant]": tenant}
        if start:
            params["from"] = start.isoformat()
        if end:
            params["to"] = end.isoformat()
        r = await client.get("/logs", params=params, headers=admin.headers)
        assert r.status_code == 200, r.text
        return [e["message"] for e in r.json()["data"]]

    assert await between(base + US, None) == ["at 2", "at 1"]
    assert await between(None, base + US) == ["at 1", "at 0"]
    assert await between(base + US, base + US) == ["at 1"]
    r = await client.get("/logs", params={"filter[tenant]": tenant}, headers=admin.headers)
    assert [e["timestamp"] for e in r.json()["data"]][-1] == isoformat(base)
