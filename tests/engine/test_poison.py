"""One bad item fails alone (docs/engine.md, ``isolate.py``), on SQLite and PostgreSQL:
for each batch path a poison item among good ones fails alone with its clear error, and every
good one completes.

Items the API would refuse at its door are written raw here (test-only writes); a poison the
database itself refuses (a row it cannot insert, count or delete) is made with a test-only
trigger that refuses exactly that row."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import jsonvalue
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.flows.models import Flow
from flowyard.ids import new_id
from flowyard.jsonvalue import MAX_DEPTH
from flowyard.logs.models import LogEntry
from flowyard.queue import pruner
from flowyard.queue import store as queue
from flowyard.queue.models import ComponentDayCount, Execution, FlowDayCount
from flowyard.queue.records import Outcome, StepRecord
from flowyard.runtime.pool import RunnerPool
from flowyard.runtime.worker import Worker
from flowyard.secrets.crypto import SecretBox, load_key
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_engine_e2e import active_flow, finished

Client = httpx.AsyncClient


def nested_text(depth: int) -> str:
    """The JSON text of ``nested(depth)`` (orjson cannot write it past 254)."""
    return "[" * depth + "0" + "]" * depth


def nested(depth: int) -> Any:
    """A JSON value ``depth`` arrays deep: orjson reads up to 1024, writes up to 254."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


async def enqueue(
    db: Database, flow_id: str, inputs: list[Any], *, raw: dict[int, str] | None = None
) -> list[str]:
    """Queue executions of ``flow_id`` in one transaction; ``raw[i]``: the i-th input is then
    overwritten with this text, unvetted (a row the service would never write)."""
    async with db.write() as session:
        return await enqueue_in(session, flow_id, inputs, raw=raw, sqlite=db.is_sqlite)


async def enqueue_in(
    session: AsyncSession, flow_id: str, inputs: list[Any], *, raw: dict[int, str] | None = None, sqlite: bool
) -> list[str]:
    flow = (
        await session.execute(
            sa.select(Flow.version, Flow.name, Flow.tenant, Flow.owners).where(Flow.id == flow_id)
        )
    ).one()
    now = utcnow()
    items = [
        queue.NewExecution(
            id=new_id(),
            flow_id=flow_id,
            flow_version=flow.version,
            flow_name=flow.name,
            tenant=flow.tenant,
            owner_user=queue.owner_user_of(flow.owners),
            trigger="webhook",
            input=value,
            created_at=now,
        )
        for value in inputs
    ]
    # Ids sort by creation: the poison sits among the good ones of one claim.
    items.sort(key=lambda e: e.id)
    ids = await queue.enqueue(session, items)
    for i, text in (raw or {}).items():
        cast = ":v" if sqlite else "CAST(:v AS json)"
        await session.execute(
            sa.text(f"UPDATE executions SET input = {cast} WHERE id = :id").bindparams(
                sa.bindparam("id", type_=Execution.id.type)  # stored compactly on SQLite
            ),
            {"v": text, "id": ids[i]},
        )
    return ids


async def row(db: Database, eid: str) -> tuple[str, str | None, Any, Any]:
    async with db.read() as session:
        got = (
            await session.execute(
                sa.select(Execution.status, Execution.error, Execution.finished_at, Execution.result).where(
                    Execution.id == eid
                )
            )
        ).one()
    return got[0], got[1], got[2], got[3]


async def error_logs(db: Database, eid: str) -> list[str]:
    async with db.read() as session:
        return list(
            (
                await session.scalars(
                    sa.select(LogEntry.message).where(LogEntry.execution_id == eid, LogEntry.level == "error")
                )
            ).all()
        )


async def wait_for(check: Any, within: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + within  # a liveness bound
    while asyncio.get_running_loop().time() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


@contextlib.asynccontextmanager
async def refusing(
    db: Database, table: str, event: str, sqlite_when: str, pg_when: str
) -> AsyncIterator[None]:
    """A test-only trigger: the database refuses ``event`` (INSERT/DELETE) of the rows of
    ``table`` for which the condition holds (NEW./OLD. as the event has it)."""
    name = f"test_poison_{uuid.uuid4().hex[:8]}"
    row_ref = "OLD" if event == "DELETE" else "NEW"
    async with db.write() as session:
        if db.is_sqlite:
            await session.execute(
                sa.text(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {table} WHEN {sqlite_when} "
                    "BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
                )
            )
        else:
            await session.execute(
                sa.text(
                    f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    f"IF {pg_when} THEN RAISE EXCEPTION 'refused by a test trigger'; END IF; "
                    f"RETURN {row_ref}; END $$"
                )
            )
            await session.execute(
                sa.text(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()"
                )
            )
    try:
        yield
    finally:
        async with db.write() as session:
            if db.is_sqlite:
                await session.execute(sa.text(f"DROP TRIGGER {name}"))
            else:
                await session.execute(sa.text(f"DROP FUNCTION {name}() CASCADE"))


# -- acceptance group commit -------------------------------------------------------------


async def test_a_webhook_that_cannot_be_stored_is_refused_alone(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user()
    fid = await active_flow(c, who, flow_body())
    when_sqlite = "json_extract(NEW.input, '$.poison') IS NOT NULL"
    when_pg = "json_typeof(NEW.input) = 'object' AND NEW.input->>'poison' IS NOT NULL"
    async with refusing(db, "executions", "INSERT", when_sqlite, when_pg):
        bodies = [{"n": i} for i in range(6)] + [{"poison": 1}] + [{"n": i} for i in range(6, 12)]
        # Concurrent: they share group commits, the poison among them.
        answers = await asyncio.gather(*(c.post(f"/webhooks/{fid}", json=b) for b in bodies))
    poison = answers[6]
    assert poison.status_code == 400, poison.text
    assert poison.json()["errors"][0]["message"] == "This request could not be stored."
    good = [a for i, a in enumerate(answers) if i != 6]
    assert [a.status_code for a in good] == [202] * 12, [a.text for a in good]
    for a in good:
        assert (await finished(c, who, a.json()["data"]["executionId"]))["status"] == "succeeded"
    async with db.read() as session:
        inputs = (await session.scalars(sa.select(Execution.input).where(Execution.flow_id == fid))).all()
    assert sorted(i["n"] for i in inputs) == list(range(12)), "every good one stored once, the poison not"


# -- claim -------------------------------------------------------------------------------


async def test_a_row_whose_input_cannot_be_read_fails_alone_at_the_claim(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user()
    fid = await active_flow(c, who, flow_body())
    # SQLite keeps any text; PostgreSQL's json type takes only valid JSON, so there the poison
    # is valid JSON nested deeper than orjson reads.
    poison_text = "{" if db.is_sqlite else nested_text(1100)
    ids = await enqueue(db, fid, [{"n": i} for i in range(9)], raw={4: poison_text})
    poison, good = ids[4], ids[:4] + ids[5:]
    for eid in good:
        assert (await finished(c, who, eid))["status"] == "succeeded"
    status, error, finished_at, _ = await wait_for(lambda: _done(db, poison))
    assert status == "failed"
    assert error is not None and error.startswith("its input could not be read: JSONDecodeError"), error
    assert finished_at is not None
    assert await error_logs(db, poison) == [f"execution {poison} failed: {error}"]
    # The read API serves the row (its input as the marker, never a 500) and every list page
    # that holds it, with the good rows as they are.
    r = await c.get(f"/executions/{poison}", headers=who.headers)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["input"] == jsonvalue.UNREADABLE
    assert r.json()["data"]["status"] == "failed"
    r = await c.get("/executions", params={"page[size]": 100}, headers=who.headers)
    assert r.status_code == 200, r.text
    inputs = {e["id"]: e["input"] for e in r.json()["data"]}
    assert set(inputs) == set(ids) and inputs[poison] == jsonvalue.UNREADABLE
    good_inputs = sorted(inputs[eid]["n"] for eid in good)
    assert len(set(good_inputs)) == 8 and set(good_inputs) < set(range(9)), good_inputs
    # The queue goes on: a new webhook runs.
    r = await c.post(f"/webhooks/{fid}", json={"after": True})
    assert r.status_code == 202
    assert (await finished(c, who, r.json()["data"]["executionId"]))["status"] == "succeeded"


async def _done(db: Database, eid: str) -> tuple[str, str | None, Any, Any] | None:
    got = await row(db, eid)
    return got if got[0] in ("succeeded", "failed", "cancelled") else None


async def test_a_flow_that_cannot_be_prepared_fails_only_its_executions(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user()
    good_flow = await active_flow(c, who, flow_body(name="good"))
    bad_flow = await active_flow(c, who, flow_body(name="broken"))
    # A graph the API would never save, written raw: on SQLite not even JSON.
    graph = "{" if db.is_sqlite else '{"nodes": "x"}'
    async with db.write() as session:
        cast = ":g" if db.is_sqlite else "CAST(:g AS json)"
        await session.execute(
            sa.text(f"UPDATE flows SET graph = {cast} WHERE id = :id"), {"g": graph, "id": bad_flow}
        )
        # Queued together: one claim holds both flows' executions.
        good = await enqueue_in(session, good_flow, [{"n": i} for i in range(5)], sqlite=db.is_sqlite)
        bad = await enqueue_in(session, bad_flow, [{"n": i} for i in range(3)], sqlite=db.is_sqlite)
    for eid in good:
        assert (await finished(c, who, eid))["status"] == "succeeded"
    expected = (
        "the flow could not be prepared: JSONDecodeError: unexpected end of data: line 1 column 2 (char 1)"
        if db.is_sqlite
        else "the flow could not be prepared: AttributeError: 'str' object has no attribute 'get'"
    )
    for eid in bad:
        status, error, _, _ = await wait_for(lambda eid=eid: _done(db, eid))
        assert (status, error) == ("failed", expected)
    r = await c.post(f"/webhooks/{good_flow}", json={"after": True})
    assert (await finished(c, who, r.json()["data"]["executionId"]))["status"] == "succeeded"


# -- dispatch to runners -----------------------------------------------------------------


async def test_an_execution_that_cannot_be_sent_to_a_runner_fails_alone(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user()
    fid = await active_flow(c, who, flow_body())
    # Read back fine (orjson reads up to 1024 deep), but no frame can carry it (254).
    ids = await enqueue(db, fid, [{"n": i} for i in range(16)], raw={7: nested_text(300)})
    poison, good = ids[7], ids[:7] + ids[8:]
    for eid in good:  # well within the 300 s wall time they used to wait
        assert (await finished(c, who, eid))["status"] == "succeeded"
    status, error, _, result = await wait_for(lambda: _done(db, poison))
    assert status == "failed" and result is None
    assert error == "its input could not be sent to a runner: TypeError: Recursion limit reached", error
    assert await error_logs(db, poison) == [error]


async def test_an_outcome_a_runner_cannot_send_fails_alone(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user()
    fid = await active_flow(c, who, flow_body())
    # 252 deep: the "run" message carries it (254), the runner's "done" message could not (its
    # steps hold the value deeper still). The runner's depth check (jsonvalue.MAX_DEPTH) fails
    # the step before the outcome is made; an outcome JSON cannot carry at all (an integer
    # beyond 64 bits) is tests/engine/test_runner_values.py.
    ids = await enqueue(db, fid, [{"n": i} for i in range(9)], raw={3: nested_text(252)})
    poison, good = ids[3], ids[:3] + ids[4:]
    for eid in good:
        assert (await finished(c, who, eid))["status"] == "succeeded"
    status, error, _, result = await wait_for(lambda: _done(db, poison))
    assert status == "failed" and result is None
    too_deep = f"its output nests deeper than {MAX_DEPTH} levels of arrays and objects (the limit)"
    assert error == f"step in failed: {too_deep}"
    r = await c.post(f"/webhooks/{fid}", json={"after": True})
    assert (await finished(c, who, r.json()["data"]["executionId"]))["status"] == "succeeded"


async def test_a_message_a_runner_cannot_handle_fails_alone(tmp_path: Path, registry: Registry) -> None:
    """The runner side: a "run" message the runner cannot take (here a creation time it cannot
    parse, written by the test) is refused for that execution alone; the runner stays and runs
    the others of the same frame."""
    from tests.engine.test_pool import _claimed, _runner_pids, _spec

    pool = RunnerPool(Settings(data_dir=tmp_path, runners=1))
    await pool.start()
    try:
        spec = _spec(registry, {"id": "out", "componentId": "log"})
        pid = (await _runner_pids(pool))[0]
        good = [_claimed(spec, {"n": i}) for i in range(6)]
        poison = _claimed(spec, {"poison": True})
        poison.created_at = "not a time"  # type: ignore[assignment]
        batch = [*good[:3], poison, *good[3:]]
        outcomes = await asyncio.gather(*(pool.run(spec, c) for c in batch))
        assert [(o.status, o.result) for o in outcomes[:3] + outcomes[4:]] == [
            ("succeeded", {"data": {"n": i}}) for i in range(6)
        ]
        assert (outcomes[3].status, outcomes[3].error) == (
            "failed",
            "its runner could not take it: ValueError: Invalid isoformat string: 'not a time'",
        )
        assert await _runner_pids(pool) == [pid], "the runner was not replaced"
    finally:
        await pool.close()


# -- outcome recording and counts --------------------------------------------------------


@pytest.fixture
async def worker(engine_settings: Settings, db: Database, registry: Registry, tmp_path: Path) -> Worker:
    """A worker that is not running: the test hands it outcomes and has it record them."""
    return Worker(db, engine_settings, registry, box=SecretBox(load_key(None, tmp_path)))


async def _flow(c: Client, who: Account, name: str) -> str:
    r = await c.post("/flows", json=flow_body(name=name), headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


async def _claimed_outcomes(db: Database, worker: Worker, fid: str, n: int) -> list[Outcome]:
    ids = await enqueue(db, fid, [{"n": i} for i in range(n)])
    async with db.write() as session:
        claimed = await queue.claim(session, worker_id=worker.id, limit=n, lease_seconds=30, cap=0)
    assert sorted(x.id for x in claimed) == sorted(ids)
    now = utcnow()
    return [
        Outcome(
            execution_id=x.id,
            flow_id=fid,
            tenant=x.tenant,
            owner_user=x.owner_user,
            created_at=x.created_at,
            status="succeeded",
            result=x.input,
            error=None,
            finished_at=now,
            steps=[
                StepRecord("out", "log", "log", "succeeded", 1, 1, 1, 1.0, now, now, None, x.input, 1),
            ],
        )
        for x in sorted(claimed, key=lambda x: x.id)
    ]


async def test_an_outcome_that_cannot_be_stored_fails_alone(
    client: Client, factory: Factory, db: Database, worker: Worker
) -> None:
    who = await factory.user()
    fid = await _flow(client, who, "outcomes")
    outcomes = await _claimed_outcomes(db, worker, fid, 11)
    poison = outcomes[5]
    poison.result = nested(300)  # the runner sent it (orjson read it); it cannot be written
    worker._outcomes = list(outcomes)
    await worker._flush_once()
    assert worker._outcomes == [], "nothing left to retry"
    assert worker.completed == 11
    for o in outcomes:
        status, error, finished_at, result = await row(db, o.execution_id)
        if o is poison:
            assert status == "failed" and result is None and finished_at is not None
            assert error == "its outcome could not be stored: TypeError: Recursion limit reached", error
            assert await error_logs(db, o.execution_id) == [error]
        else:
            assert (status, error, result) == ("succeeded", None, o.result)


async def test_a_count_that_cannot_be_written_is_skipped_alone(
    client: Client, factory: Factory, db: Database, worker: Worker
) -> None:
    who = await factory.user()
    good_flow = await _flow(client, who, "counted")
    bad_flow = await _flow(client, who, "uncountable")
    outcomes = await _claimed_outcomes(db, worker, good_flow, 4) + await _claimed_outcomes(
        db, worker, bad_flow, 3
    )
    worker._outcomes = list(outcomes)
    async with refusing(
        db, "component_day_counts", "INSERT", f"NEW.flow_id = '{bad_flow}'", f"NEW.flow_id = '{bad_flow}'"
    ):
        await worker._flush_once()
    assert worker._outcomes == [] and worker.completed == 7
    for o in outcomes:
        status, error, _, result = await row(db, o.execution_id)
        assert (status, error, result) == ("succeeded", None, o.result), "recorded, whatever its count"
    async with db.read() as session:
        counted = (await session.execute(sa.select(ComponentDayCount.flow_id, ComponentDayCount.steps))).all()
    assert sorted(counted) == [(good_flow, 4)], "the others counted, the poison's count skipped"


async def test_a_webhook_whose_count_cannot_be_written_is_stored_uncounted(
    engine_client: Client, factory: Factory, db: Database
) -> None:
    c = engine_client
    who = await factory.user()
    good_flow = await active_flow(c, who, flow_body(name="counted"))
    bad_flow = await active_flow(c, who, flow_body(name="uncountable"))
    async with refusing(
        db, "flow_day_counts", "INSERT", f"NEW.flow_id = '{bad_flow}'", f"NEW.flow_id = '{bad_flow}'"
    ):
        answers = await asyncio.gather(
            *(c.post(f"/webhooks/{fid}", json={"i": i}) for i in range(5) for fid in (good_flow, bad_flow))
        )
    assert [a.status_code for a in answers] == [202] * 10, [a.text for a in answers]
    for a in answers:
        assert (await finished(c, who, a.json()["data"]["executionId"]))["status"] == "succeeded"
    async with db.read() as session:
        counted = (await session.execute(sa.select(FlowDayCount.flow_id, FlowDayCount.executions))).all()
    assert sorted(counted) == [(good_flow, 5)]


# -- pruning -----------------------------------------------------------------------------


async def test_a_row_that_cannot_be_pruned_is_skipped_alone(
    client: Client, factory: Factory, db: Database
) -> None:
    who = await factory.user()
    fid = await _flow(client, who, "pruned")
    ids = await enqueue(db, fid, [{"n": i} for i in range(7)])
    async with db.write() as session:
        await session.execute(
            sa.update(Execution).where(Execution.id.in_(ids)).values(status="succeeded", finished_at=utcnow())
        )
    poison = ids[2]
    # On SQLite the id is stored as its 12 bytes (flowyard.db.compact): a BLOB literal.
    async with refusing(db, "executions", "DELETE", f"OLD.id = X'{poison}'", f"OLD.id = '{poison}'"):
        later = utcnow() + timedelta(days=30)
        counts = await pruner.prune(db, retention=timedelta(days=1), batch=3, now=later)
        assert counts["executions"] == 6
        again = await pruner.prune(db, retention=timedelta(days=1), batch=3, now=later)
        assert again["executions"] == 0, "skipped again, and the pass ends"
    async with db.read() as session:
        left = (await session.scalars(sa.select(Execution.id).where(Execution.flow_id == fid))).all()
    assert list(left) == [poison]


# -- event-trigger intake ----------------------------------------------------------------


@pytest.mark.slow
def test_a_broker_message_deeper_than_the_limit_runs_alone_as_its_text(tmp_path: Path) -> None:
    """Through a real `flowyard serve` and Redis streams: an entry whose value is JSON nested
    deeper than the limit (``jsonvalue.MAX_DEPTH``; before: read fine, then nested too deep to be
    written, so the consumer reconnected and re-read it forever) is carried as its text, as any
    value that does not parse within the limit is, and never blocks the entries after it."""
    from tests.connectors.conftest import require_server
    from tests.connectors.test_triggers import (
        REDIS_URL,
        _executions,
        _redis,
        _sqlite_cluster,
        _status,
        _trigger_flow,
        _wait,
    )
    from tests.engine.test_processes import _login

    require_server("Redis", 6379)
    stream = f"flowyard-test-{uuid.uuid4().hex[:8]}"
    c = _sqlite_cluster(tmp_path)
    c.start("serve", "serve")
    try:
        c.wait_ready()
        headers = _login(c)
        fid = _trigger_flow(
            c, headers, REDIS_URL, {"componentId": "redis", "function": "xread", "fields": {"key": stream}}
        )
        _wait("the flow to become active", lambda: _status(c, headers, fid)["status"] == "active")

        async def add(r: Any) -> None:
            for i in range(10):
                if i == 5:
                    await r.xadd(stream, {"deep": nested_text(300)})
                await r.xadd(stream, {"i": str(i)})

        _redis(add)
        rows = _wait(
            "every entry to run",
            lambda: (r := _executions(c, fid)) and len(r) >= 11 and all(x[1] == "succeeded" for x in r) and r,
        )
        assert sorted(int(r[0]["i"]) for r in rows if "i" in r[0]) == list(range(10)), "each good entry once"
        assert [r[0] for r in rows if "i" not in r[0]] == [{"deep": nested_text(300)}], "the deep one as text"
        group = f"flowyard-{fid}"
        _wait("nothing pending", lambda: _redis(lambda r: r.xpending(stream, group))["pending"] == 0)
        log = c.log("serve")
        assert "reconnecting" not in log, "the consumer never stopped"
        assert "Traceback" not in log, log
    finally:
        c.stop_all()
        _redis(lambda r: r.delete(stream))
