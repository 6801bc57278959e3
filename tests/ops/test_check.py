"""`flowyard check` against the real SQLite file and PostgreSQL: a healthy database, a pending
migration, a revision from a newer flowyard, stuck leases, an unreachable or missing database;
and the command's exit status and --json output as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from flowyard.api.listing import ListQuery
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.db.compact import id_cell, time_cell
from flowyard.db.session import Database
from flowyard.executions.service import steps_of
from flowyard.flows import service as flows
from flowyard.iam.principal import Principal
from flowyard.ids import new_id
from flowyard.logs.models import LogEntry
from flowyard.ops.check import _PAGE, Report, check, find_bad_cells
from flowyard.queue.models import Execution
from tests.cli.test_cli import run
from tests.conftest import flow_body
from tests.engine.test_processes import _free_port
from tests.migrations.test_migrations import empty_url  # noqa: F401 - fixture


def _by_name(report: Report) -> dict[str, dict[str, object]]:
    return report.as_dict()["checks"]  # type: ignore[no-any-return]


async def _add(db: Database, status: str, *, lease_expires_in: float | None = None, age: float = 0) -> str:
    now = utcnow()
    eid = new_id()
    async with db.write() as session:
        session.add(
            Execution(
                id=eid,
                flow_id=new_id(),
                flow_version=1,
                trigger="webhook",
                status=status,
                created_at=now - timedelta(seconds=age),
                attempts=1 if status == "running" else 0,
                lease_owner="w1" if status == "running" else None,
                lease_expires_at=now + timedelta(seconds=lease_expires_in)
                if lease_expires_in is not None
                else None,
            )
        )
    return eid


async def test_healthy_database_with_queue_and_stuck_leases(db: Database, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=db.url.render_as_string(hide_password=False))
    report = await check(settings)
    assert report.ok, report.as_dict()
    checks = _by_name(report)
    assert list(checks) == ["database", "schema", "integrity", "queue", "leases", "json", "flowCounts"]
    assert checks["schema"]["revision"] == migrate.script_head() and checks["schema"]["pending"] == []
    assert checks["queue"]["queued"] == 0 and checks["queue"]["running"] == 0
    assert checks["integrity"]["ok"] is True

    await _add(db, "queued", age=120)
    await _add(db, "queued")
    await _add(db, "running", lease_expires_in=20)  # held by a live worker
    await _add(db, "running", lease_expires_in=-5)  # expired a moment ago: the reaper's to take
    await _add(db, "succeeded")
    report = await check(settings)
    checks = _by_name(report)
    assert report.ok, report.as_dict()
    assert (checks["queue"]["queued"], checks["queue"]["running"]) == (2, 2)
    assert 119 <= checks["queue"]["oldestQueuedAgeSeconds"] < 600  # type: ignore[operator]
    assert checks["leases"]["stuck"] == 0

    # Expired for longer than a lease: no engine reaps this database.
    await _add(db, "running", lease_expires_in=-(settings.lease_seconds + 10))
    report = await check(settings)
    checks = _by_name(report)
    assert not report.ok
    assert [n for n, c in checks.items() if not c["ok"]] == ["leases"]
    assert checks["leases"]["stuck"] == 1
    # A tighter threshold counts the recent one too.
    assert _by_name(await check(settings, stuck_after=1))["leases"]["stuck"] == 2


def test_pending_and_unknown_revisions(empty_url: str, tmp_path: Path) -> None:  # noqa: F811
    settings = Settings(data_dir=tmp_path, database_url=empty_url)
    migrate.upgrade(empty_url, "0007")
    report = asyncio.run(check(settings))
    checks = _by_name(report)
    assert not report.ok and [n for n, c in checks.items() if not c["ok"]] == ["schema"]
    assert checks["schema"]["revision"] == "0007"
    assert checks["schema"]["pending"] == migrate.pending_revisions("0007")
    assert checks["schema"]["pending"][-1] == migrate.script_head()
    assert "flowyard migrate" in str(checks["schema"]["summary"])

    migrate.upgrade(empty_url)
    assert asyncio.run(check(settings)).ok

    async def newer() -> None:
        db = Database(empty_url)
        try:
            async with db.write() as session:
                await session.execute(sa.text("UPDATE alembic_version SET version_num = 'ffff_future'"))
        finally:
            await db.dispose()

    asyncio.run(newer())
    checks = _by_name(asyncio.run(check(settings)))
    assert checks["schema"]["ok"] is False and checks["schema"]["pending"] is None
    assert "unknown" in str(checks["schema"]["summary"])


def test_integrity_failure_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "flowyard.db"
    migrate.upgrade(f"sqlite+aiosqlite:///{path}")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    # An index that no longer matches its table: what integrity_check exists to find.
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("INSERT INTO tenants (id, name, created_at, updated_at) VALUES ('t1', 'x', 'a', 'b')")
    conn.commit()
    conn.close()
    raw = bytearray(path.read_bytes())
    # Turn the row's name in the table b-tree into another value; the index keeps the old one.
    at = raw.rfind(b"t1x")
    assert at > 0
    raw[at + 2 : at + 3] = b"y"
    path.write_bytes(bytes(raw))
    report = asyncio.run(check(Settings(data_dir=tmp_path, database_url=f"sqlite+aiosqlite:///{path}")))
    checks = _by_name(report)
    assert not report.ok and checks["integrity"]["ok"] is False, checks
    assert checks["integrity"]["messages"] != ["ok"]


def test_missing_or_unreachable_database(tmp_path: Path) -> None:
    missing = tmp_path / "nothing" / "flowyard.db"
    report = asyncio.run(check(Settings(data_dir=missing.parent)))
    assert not report.ok and list(_by_name(report)) == ["database"]
    assert not missing.exists()  # looking did not create it

    port = _free_port()  # nobody listens there: refused at once, on loopback
    url = f"postgresql+asyncpg://flowyard:hunter2-not-shown@127.0.0.1:{port}/flowyard"
    report = asyncio.run(check(Settings(data_dir=tmp_path, database_url=url)))
    checks = _by_name(report)
    assert not report.ok and checks["database"]["ok"] is False and list(checks) == ["database"]
    assert "hunter2" not in json.dumps(report.as_dict())


@pytest.mark.slow
def test_check_command_exit_status_and_json(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWYARD_")}
    env["FLOWYARD_DATA_DIR"] = str(tmp_path)
    missing = run("check", env=env, ok=False)  # no database yet
    assert missing.returncode == 1
    assert "FAIL  database" in missing.stdout and "some checks failed" in missing.stdout
    run("migrate", env=env)
    out = run("check", "--json", env=env)
    body = json.loads(out.stdout)
    assert body["ok"] is True and body["checks"]["schema"]["revision"] == migrate.script_head()
    conn = sqlite3.connect(tmp_path / "flowyard.db")
    # The stored forms (flowyard.db.compact): the id as 12 bytes, the times as microseconds.
    start = datetime(2026, 1, 1, tzinfo=UTC)
    conn.execute(
        "INSERT INTO executions (id, flow_id, flow_version, trigger, status, created_at, attempts, "
        "lease_owner, lease_expires_at) VALUES (?, ?, 1, 'cron', 'running', ?, 1, 'gone', ?)",
        (id_cell(new_id()), new_id(), time_cell(start), time_cell(start + timedelta(seconds=30))),
    )
    conn.commit()
    conn.close()
    failed = run("check", "--json", env=env, ok=False)
    assert failed.returncode == 1
    body = json.loads(failed.stdout)
    assert body["ok"] is False and body["checks"]["leases"]["stuck"] == 1


async def _bad_cell(db: Database, table: str, column: str, key: object, text: str) -> None:
    """A test-only raw write of a cell the service never writes: any text in a SQLite cell,
    what PostgreSQL's json type takes but orjson does not (1e400, a lone surrogate escape)."""
    value = ":v" if db.is_sqlite else "CAST(CAST(:v AS text) AS json)"
    async with db.write() as session:
        key_type = Execution.id.type if table == "executions" else sa.Integer()  # compact on SQLite
        await session.execute(
            sa.text(f"UPDATE {table} SET {column} = {value} WHERE id = :k").bindparams(
                sa.bindparam("k", type_=key_type)
            ),
            {"v": text, "k": key},
        )


async def test_the_cell_scan_reads_past_its_first_page(db: Database) -> None:
    """The scan pages by key: each page after the last key read, bound as the key's own type
    (an execution id is 12 bytes on SQLite; bound as text, every BLOB is "after" it, so the scan
    read its first page forever). A bad cell in the third page is found, once."""
    now = utcnow()
    rows = [
        {
            "id": new_id(),
            "flow_id": new_id(),
            "flow_version": 1,
            "trigger": "webhook",
            "status": "succeeded",
            "created_at": now,
            "attempts": 1,
            "input": {"n": i},
        }
        for i in range(2 * _PAGE + 5)
    ]
    async with db.write() as session:
        await session.execute(sa.insert(Execution), rows)
    last = rows[-2]["id"]
    await _bad_cell(db, "executions", "input", last, "Inf" if db.is_sqlite else "1e400")
    bad = await asyncio.wait_for(find_bad_cells(db), timeout=120)
    assert [(c.table, c.key, c.column) for c in bad] == [("executions", last, "input")]


async def test_unreadable_json_cells_are_named_and_quarantined(db: Database, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=db.url.render_as_string(hide_password=False))
    good, stuck, done, running = [await _add(db, s) for s in ("queued", "queued", "succeeded", "running")]
    async with db.write() as session:
        await session.execute(sa.update(Execution).values(input={"fine": [1]}))
        session.add(LogEntry(timestamp=utcnow(), level="info", message="m", data={"x": 1}))
    async with db.read() as session:
        log_id = await session.scalar(sa.select(LogEntry.id))
    bad_number = "Inf" if db.is_sqlite else "1e400"
    await _bad_cell(db, "executions", "input", stuck, bad_number)
    await _bad_cell(db, "executions", "input", running, '"\\ud800"')
    await _bad_cell(db, "executions", "result", done, bad_number)
    await _bad_cell(db, "logs", "data", log_id, '"\\udfff"')
    if db.is_sqlite:  # nothing stops a raw write of a value deeper than the store writes
        await _bad_cell(db, "executions", "steps", good, "[" * 200 + "]" * 200)
        # A packed steps document (db/packed.py) whose deflate stream is broken.
        async with db.write() as session:
            await session.execute(
                sa.text("UPDATE executions SET steps = :v WHERE id = :k").bindparams(
                    sa.bindparam("k", type_=Execution.id.type)
                ),
                {"v": b"\x01\xff\xfe", "k": done},
            )

    report = await check(settings)
    assert not report.ok
    found = _by_name(report)["json"]
    assert found["ok"] is False
    expected = {
        ("executions", stuck, "input"),
        ("executions", running, "input"),
        ("executions", done, "result"),
        ("logs", log_id, "data"),
    } | ({("executions", good, "steps"), ("executions", done, "steps")} if db.is_sqlite else set())
    cells = found["unreadable"]
    assert {(c["table"], c["id"], c["column"]) for c in cells} == expected  # type: ignore[union-attr]
    whys = {(c["id"], c["column"]): c["why"] for c in cells}  # type: ignore[union-attr]
    assert whys[(stuck, "input")].startswith("not JSON orjson reads (")
    assert "surrogate" in whys[(running, "input")]
    if db.is_sqlite:
        assert whys[(good, "steps")] == "nests deeper than 131 levels"
        assert whys[(done, "steps")].startswith("a packed value that cannot be inflated ("), whys
    assert "flowyard check --quarantine" in str(found["summary"])

    report = await check(settings, quarantine=True)
    assert report.ok, report.as_dict()
    done_check = _by_name(report)["json"]
    assert done_check["quarantinedCount"] == len(expected)
    assert sorted(done_check["failedExecutions"]) == sorted([stuck, running])  # type: ignore[arg-type]
    async with db.read() as session:
        rows = {
            e.id: e
            for e in (
                await session.scalars(sa.select(Execution).options(sa.orm.undefer(Execution.steps)))
            ).all()
        }
        logged = await session.scalar(sa.select(LogEntry.data).where(LogEntry.id == log_id))
    # Every row reads again; each bad cell now holds its raw text as a JSON string.
    assert rows[stuck].input == bad_number and rows[running].input == '"\\ud800"'
    assert rows[done].result == bad_number and logged == '"\\udfff"'
    assert rows[stuck].status == rows[running].status == "failed"
    assert "its input could not be read (not JSON" in (rows[stuck].error or "")
    assert rows[good].status == "queued" and rows[good].input == {"fine": [1]}
    assert rows[done].status == "succeeded"
    # Each failed one has its error log entry, as every execution the queue fails has.
    async with db.read() as session:
        errors = (
            await session.execute(
                sa.select(LogEntry.execution_id, LogEntry.message).where(LogEntry.level == "error")
            )
        ).all()
    assert sorted(eid for eid, _ in errors) == sorted([stuck, running])
    assert all(m == f"execution {eid} failed: {rows[eid].error}" for eid, m in errors), errors
    assert (await check(settings)).ok
    if db.is_sqlite:  # a quarantined steps document is served as no steps (its text stays stored)
        assert rows[good].steps == "[" * 200 + "]" * 200
        assert steps_of(rows[good]) == []
        assert rows[done].steps == repr(b"\x01\xff\xfe") and steps_of(rows[done]) == []


def test_check_command_names_and_quarantines_unreadable_cells(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWYARD_")}
    env["FLOWYARD_DATA_DIR"] = str(tmp_path)
    run("migrate", env=env)
    eid = new_id()
    conn = sqlite3.connect(tmp_path / "flowyard.db")
    conn.execute(
        "INSERT INTO executions (id, flow_id, flow_version, trigger, status, created_at, attempts, input) "
        "VALUES (?, ?, 1, 'webhook', 'queued', ?, 0, 'Inf')",
        (id_cell(eid), new_id(), time_cell(datetime(2026, 1, 1, tzinfo=UTC))),
    )
    conn.commit()
    conn.close()
    failed = run("check", env=env, ok=False)
    assert failed.returncode == 1
    assert f"FAIL  json       1 JSON cells cannot be read: executions {eid} input: not JSON" in failed.stdout
    assert "flowyard check --quarantine" in failed.stdout
    fixed = run("check", "--quarantine", "--json", env=env)
    body = json.loads(fixed.stdout)
    assert body["ok"] is True and body["checks"]["json"]["failedExecutions"] == [eid]
    run("check", env=env)


async def test_flow_counts_that_disagree_are_named_and_recounted(
    db: Database, tmp_path: Path, registry: Registry
) -> None:
    """A status written by hand (past flows.status.move) leaves the flow lists' counts behind:
    check names the rows that differ and fails; --recount rebuilds them, and the list's total is
    the rule's again."""
    settings = Settings(data_dir=tmp_path, database_url=db.url.render_as_string(hide_password=False))
    admin = Principal("a" * 24, "admin@example.com", None, frozenset({"all"}), "")
    member = Principal("b" * 24, "m@example.com", "1" * 24, frozenset({"tenant.flows.read"}), "")
    async with db.write() as session:
        made = [
            flows.prepare_new_flow(
                admin, flow_body(f"f{i}", owners=[{"type": "tenant", "id": "1" * 24}]), registry
            )
            for i in range(3)
        ]
        await flows.insert_flows(session, made)
    assert _by_name(await check(settings))["flowCounts"]["ok"] is True
    async with db.write() as session:
        await session.execute(sa.text("UPDATE flows SET status = 'active' WHERE id = :i"), {"i": made[0].id})

    async def active_total() -> int:
        return (await flows.list_flows(db, member, ListQuery(filters={"status": "active"})))[1]

    assert await active_total() == 0  # the hand edit is not counted
    report = await check(settings)
    assert not report.ok
    found = _by_name(report)["flowCounts"]
    assert found["ok"] is False and "flowyard check --recount" in str(found["summary"])
    rows = found["rows"]
    # every scope the flow is counted in (all flows; its creator, added as an owner; tenant 1;
    # creator and tenant 1), in its old and its new status
    scopes = [("", ""), (admin.user_id, ""), ("", "1" * 24), (admin.user_id, "1" * 24)]
    expected = {(u, t, "inactive", 3, 2) for u, t in scopes} | {(u, t, "active", 0, 1) for u, t in scopes}
    assert {(r["user"], r["tenant"], r["status"], r["kept"], r["counted"]) for r in rows} == expected  # type: ignore[union-attr]
    report = await check(settings, recount=True)
    assert report.ok, report.as_dict()
    assert _by_name(report)["flowCounts"]["recounted"] == 8
    assert await active_total() == 1
    assert _by_name(await check(settings))["flowCounts"]["differ"] == 0
