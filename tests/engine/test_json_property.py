"""The property issue 15 asks for, through the real HTTP stack on SQLite and PostgreSQL: any
body (every JSON type at the top level, nesting up to and past the limit, unicode with NUL and
surrogate escapes, lone ones too, huge numbers) is either refused with a 4xx, or stored and run
by a flow that passes its input through, to the result it was parsed as; and after each batch
of bodies a normal webhook to another flow still completes.

The engine (API, engine and a runner process) keeps running across the examples, on an event
loop of its own in a thread (an anyio blocking portal); each example posts its bodies at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowyard.app import create_app
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.jsonvalue import MAX_DEPTH
from tests.conftest import Account, Factory, truncate
from tests.engine.test_engine_e2e import active_flow
from tests.engine.test_json_values import canonical, passing_flow

JSON = {"Content-Type": "application/json"}
FINISHED = ("succeeded", "failed", "cancelled")


@dataclass
class Running:
    client: httpx.AsyncClient
    who: Account
    flow: str
    other: str


@contextlib.asynccontextmanager
async def running_engine(engine_settings: Settings, registry: Registry) -> AsyncIterator[Running]:
    db = Database(engine_settings.resolved_database_url())
    await truncate(db)
    app = create_app(engine_settings, db=db, registry=registry, run_engine=True)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://flowyard.test") as c:
                factory = Factory(db)
                who = await factory.user(tenant=await factory.tenant())
                flow = await active_flow(c, who, passing_flow("property"))
                other = await active_flow(c, who, passing_flow("other"))
                yield Running(c, who, flow, other)
    finally:
        await db.dispose()


@pytest.fixture
def engine(engine_settings: Settings, registry: Registry) -> Iterator[tuple[BlockingPortal, Running]]:
    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(running_engine(engine_settings, registry)) as running,
    ):
        yield portal, running


def depth(value: Any) -> int:
    """How many arrays and objects nest (the test's own count, iterative)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


# -- bodies ------------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["\x00", "a\x00b", "\u2028", "\U0001f600", "é", '"\\/'])
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def encoded(draw: st.DrawFn) -> bytes:
    """A JSON value as text, escaped (\\uXXXX, surrogate pairs) or not, with some whitespace."""
    text = json.dumps(draw(values), ensure_ascii=draw(st.booleans()))
    pad = draw(st.sampled_from(["", " ", "\n", "\t "]))
    return (pad + text + pad).encode()


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    """Nesting around the limit and far past it."""
    levels = draw(
        st.sampled_from([MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 254, 255, 1024, 1025])
        | st.integers(min_value=1, max_value=300)
    )
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"k":', b"}"), (b'[{"":', b"}]")]))
    leaf = draw(encoded())
    if opener == b'[{"":':  # two levels a time
        levels = max(1, levels // 2)
    return opener * levels + leaf + closer * levels


raw_oddities = st.sampled_from(
    [
        b'"\\ud800"',  # lone surrogate escapes: not a string UTF-8 can hold
        b'["\\udc00x"]',
        b'{"\\ud83d": 1}',
        b'"\\ud83d\\ude00"',  # a valid pair
        b'"\\u0000"',
        b"1e400",
        b"-1e400",
        b"1e308",
        b"-0",
        b"-0.0",
        b"",
        b"nul",
        b"[1,]",
        b"\xff",
        b'"\xed\xa0\x80"',  # a surrogate encoded in UTF-8 (invalid UTF-8)
    ]
)
huge_numbers = st.integers(min_value=2**63 - 2, max_value=10**400).map(
    lambda n: str(n).encode()
) | st.integers(max_value=-(2**63) + 2, min_value=-(10**400)).map(lambda n: str(n).encode())
bodies = encoded() | deep() | raw_oddities | huge_numbers


# -- the property ----------------------------------------------------------------------------------


def expectation(raw: bytes) -> Any:
    """None: must be refused with a 4xx; else the canonical text of the result it runs to."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if depth(value) > MAX_DEPTH:
        return None
    return canonical({"data": value})


async def post_and_run(running: Running, raws: list[bytes]) -> None:
    c, who = running.client, running.who
    replies = await asyncio.gather(
        *(c.post(f"/webhooks/{running.flow}", content=r, headers=JSON) for r in raws)
    )
    accepted = []
    for raw, reply in zip(raws, replies, strict=True):
        expected = expectation(raw)
        if expected is None:
            assert 400 <= reply.status_code < 500, (raw[:200], reply.status_code, reply.text)
            assert reply.json()["errors"][0]["code"] == reply.status_code
        else:
            assert reply.status_code == 202, (raw[:200], reply.text)
            accepted.append((raw, expected, reply.json()["data"]["executionId"]))

    async def outcome(eid: str) -> dict[str, Any]:
        async with asyncio.timeout(60):
            while True:
                r = await c.get(f"/executions/{eid}", headers=who.headers)
                assert r.status_code == 200, r.text
                e: dict[str, Any] = r.json()["data"]
                if e["status"] in FINISHED:
                    return e
                await asyncio.sleep(0.02)

    for raw, expected, eid in accepted:
        e = await outcome(eid)
        assert e["status"] == "succeeded", (raw[:200], e)
        assert canonical(e["result"]) == expected, raw[:200]
        assert canonical({"data": e["input"]}) == expected, raw[:200]
    # The queue goes on: a normal webhook to another flow completes (generous bound).
    r = await c.post(f"/webhooks/{running.other}", json={"normal": True}, headers=JSON)
    assert r.status_code == 202, r.text
    async with asyncio.timeout(10):
        e = await outcome(r.json()["data"]["executionId"])
    assert e["status"] == "succeeded" and e["result"] == {"data": {"normal": True}}, e


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(raws=st.lists(bodies, min_size=1, max_size=6))
def test_every_body_is_refused_or_stored_and_run_as_parsed(
    engine: tuple[BlockingPortal, Running], raws: list[bytes]
) -> None:
    portal, running = engine
    portal.call(post_and_run, running, raws)
