"""Migrations 0024, 0025 and 0026 (issue 19, storage) over a database filled before them:

- 0024: the queue's indexes become partial over the queued and the running rows, the callers'
  index over the rows that have one; the rows stay as they were.
- 0025: on SQLite the log rows' ids become 12 bytes and their times integers; an entry of a
  tenant no longer repeats its user. The values read through the model are those written
  before (the user aside), and the filters find them; down to 0023 gives the text back.
- 0026: the same for an execution's own ids and times, a finished one's queue group goes, and
  long log messages are packed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from flowyard.db.compact import time_cell
from flowyard.db.dialect import insert_ignore_for
from flowyard.ids import new_id
from flowyard.logs.models import LogEntry
from flowyard.queue.models import SCHEDULED, Execution
from tests.migrations.test_list_indexes import FLOW, LONER, T1, T2, _fill, _state
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

ODD_TENANT, UPPER_FLOW = "acme-corp", "ABCDEF0123456789ABCDEF01"
PARTIAL = {
    "ix_executions_queued_group_id": ("status", "queue_group", "id"),
    "ix_executions_running_group_id": ("status", "queue_group", "id"),
    "ix_executions_parent": ("parent_execution_id",),
}


def _add_odd(conn: sa.Connection, sqlite: bool) -> None:
    when = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
    conn.execute(
        sa.text(
            "INSERT INTO logs (timestamp, level, message, tenant, user_id, flow_id, execution_id)"
            " VALUES (:c, 'warn', 'odd', :t, :u, :f, NULL)"
        ),
        {
            "c": when.replace(tzinfo=None).isoformat(sep=" ") if sqlite else when,
            "t": ODD_TENANT,
            "u": LONER,
            "f": UPPER_FLOW,
        },
    )
    conn.commit()


def _entries(url: str) -> list[tuple[Any, ...]]:
    """Every entry as the model reads it."""

    def read(conn: sa.Connection) -> list[tuple[Any, ...]]:
        rows = conn.execute(
            sa.select(
                LogEntry.id,
                LogEntry.timestamp,
                LogEntry.tenant,
                LogEntry.user_id,
                LogEntry.flow_id,
                LogEntry.execution_id,
            ).order_by(LogEntry.id)
        )
        return [tuple(r) for r in rows]

    return _in_sync(url, read)


def _raw(url: str) -> list[tuple[Any, ...]]:
    def read(conn: sa.Connection) -> list[tuple[Any, ...]]:
        rows = conn.exec_driver_sql(
            "SELECT id, timestamp, tenant, user_id, flow_id, execution_id FROM logs ORDER BY id"
        )
        return [tuple(r) for r in rows]

    return _in_sync(url, read)


def _as_read(raw: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows written as text before 0025, as the model reads them after it: aware times, the
    user only on the entries of no tenant."""

    def when(cell: Any) -> datetime:
        value = datetime.fromisoformat(cell) if isinstance(cell, str) else cell
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    return [(i, when(t), tenant, user if tenant is None else None, f, e) for i, t, tenant, user, f, e in raw]


def test_queue_indexes_become_partial_over_existing_rows(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0023")
    _fill(empty_url)
    before, executions, logs = _state(empty_url)
    migrate.upgrade(empty_url, "0024")
    after, executions_after, logs_after = _state(empty_url)
    assert (executions_after, logs_after) == (executions, logs)
    assert {"ix_executions_status_queue_group_id", "ix_executions_status_lease"} <= before["executions"]
    assert not {"ix_executions_status_queue_group_id", "ix_executions_status_lease"} & after["executions"]
    shapes = {name: (columns, options) for table, name, columns, options in after["shapes"]}
    for name, columns in PARTIAL.items():
        got_columns, options = shapes[name]
        assert got_columns == columns
        where = " ".join(v for _k, v in options if _k.endswith("_where"))
        assert ("IS NOT NULL" in where) if name == "ix_executions_parent" else ("status" in where), (
            name,
            options,
        )

    def queued(conn: sa.Connection) -> list[str]:
        return [
            r[0]
            for r in conn.execute(
                sa.text(
                    "SELECT id FROM executions WHERE status = 'queued' AND queue_group IS NULL ORDER BY id"
                )
            )
        ]

    # The rows of the fill (no queue group) are all still there, by the same statements.
    assert len(_in_sync(empty_url, queued)) == 10
    migrate.downgrade(empty_url, "0023")
    assert _state(empty_url) == (before, executions, logs)


def test_log_rows_become_compact_and_read_the_same(empty_url: str) -> None:
    sqlite = empty_url.startswith("sqlite")
    migrate.upgrade(empty_url, "0024")
    _fill(empty_url)
    _in_sync(empty_url, lambda conn: _add_odd(conn, sqlite))
    raw_before = _raw(empty_url)
    assert len(raw_before) == 31
    migrate.upgrade(empty_url, "0025")
    assert _entries(empty_url) == _as_read(raw_before)
    if sqlite:
        cells = _in_sync(
            empty_url,
            lambda conn: conn.exec_driver_sql(
                "SELECT typeof(timestamp), typeof(tenant), typeof(user_id), typeof(flow_id),"
                " typeof(execution_id) FROM logs ORDER BY id"
            ).all(),
        )
        kinds = {tuple(c) for c in cells}
        # Hex ids as bytes, a tenant's user gone, times as integers; the ids of another form
        # (the fill's tenants "ttt…" and "uuu…", the odd ones) stay text.
        assert kinds == {
            ("integer", "text", "null", "blob", "blob"),
            ("integer", "null", "blob", "blob", "blob"),
            ("integer", "text", "null", "text", "null"),
        }, kinds

    def found(conn: sa.Connection) -> dict[str, int]:
        def count(*where: Any) -> int:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(LogEntry).where(*where)).scalar_one()
            )

        return {
            "t1": count(LogEntry.tenant == T1),
            "t2 flow": count(LogEntry.tenant == T2, LogEntry.flow_id == FLOW),
            "loner": count(LogEntry.tenant.is_(None), LogEntry.user_id == LONER),
            "odd": count(LogEntry.tenant == ODD_TENANT, LogEntry.flow_id == UPPER_FLOW),
            "execution": count(LogEntry.execution_id == f"{4:024x}"),
            "since": count(LogEntry.timestamp >= datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)),
        }

    assert _in_sync(empty_url, found) == {
        "t1": 10,
        "t2 flow": 10,
        "loner": 10,
        "odd": 1,
        "execution": 1,
        "since": 1,
    }
    migrate.downgrade(empty_url, "0024")
    # Text again, the same values, but for the users that the entries of a tenant no longer keep.
    raw_down = _raw(empty_url)
    assert _as_read(raw_down) == _as_read(raw_before)
    assert all(isinstance(cell, str | None) for row in raw_down for cell in row[2:])
    if sqlite:
        assert all(isinstance(row[1], str) for row in raw_down)
    migrate.upgrade(empty_url, "0025")
    assert _entries(empty_url) == _as_read(raw_before)


def test_the_downgrade_gives_packed_data_back_as_json_text(empty_url: str) -> None:
    """Entries written at 0025 have their ``data`` packed on SQLite; the release before reads
    it as JSON text, so the downgrade turns it back (both stored forms: as it is and deflated)."""
    migrate.upgrade(empty_url, "0025")
    small = {"ok": True}
    large = {"runs": 1, "attempts": 1, "messagesIn": 1, "messagesOut": 1, "durationMs": 1.5, "ü": "ß"}

    def write(conn: sa.Connection) -> None:
        for data in (small, large, None):
            conn.execute(
                sa.insert(LogEntry).values(
                    timestamp=datetime(2026, 12, 7, 12, tzinfo=UTC),
                    level="info",
                    message="m",
                    tenant=T1,
                    flow_id=FLOW,
                    data=data,
                )
            )
        conn.commit()

    _in_sync(empty_url, write)

    def cells(conn: sa.Connection) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT data FROM logs ORDER BY id")]

    if empty_url.startswith("sqlite"):
        stored = _in_sync(empty_url, cells)
        assert [type(c[0]) for c in stored] == [bytes, bytes, type(None)]
        assert stored[0][0][:1] == b"\x00" and stored[1][0][:1] == b"\x01"  # as it is; deflated
    migrate.downgrade(empty_url, "0024")
    down = _in_sync(empty_url, cells)
    as_json = [json.loads(c[0]) if isinstance(c[0], str) else c[0] for c in down]
    assert as_json == [small, large, None]
    migrate.upgrade(empty_url, "0025")
    assert [
        r[0]
        for r in _in_sync(
            empty_url, lambda conn: conn.execute(sa.select(LogEntry.data).order_by(LogEntry.id)).all()
        )
    ] == [small, large, None]


_EXECUTION_COLUMNS = (
    "id",
    "tenant",
    "owner_user",
    "retry_of",
    "rerun_of",
    "parent_execution_id",
    "created_at",
    "started_at",
    "finished_at",
    "scheduled_for",
    "lease_expires_at",
    "resume_at",
    "status",
    "queue_group",
)
HEX_TENANT = "1234567890abcdef12345678"
SUMMARY = "step out (log) ran 1 time(s) in 1.5 ms, 1 message(s) out"


def _executions(url: str) -> list[tuple[Any, ...]]:
    """Every execution as the model reads it, and every log message."""

    def read(conn: sa.Connection) -> list[tuple[Any, ...]]:
        rows = conn.execute(
            sa.select(*(getattr(Execution, c) for c in _EXECUTION_COLUMNS)).order_by(Execution.id)
        ).all()
        messages = conn.execute(sa.select(LogEntry.message).order_by(LogEntry.id)).scalars().all()
        # Sorted here: a stored id of another form (text) sorts before the BLOBs in SQL.
        return [*sorted(tuple(r) for r in rows), tuple(messages)]

    return _in_sync(url, read)


def _execution_cells(url: str) -> list[tuple[Any, ...]]:
    def read(conn: sa.Connection) -> list[tuple[Any, ...]]:
        names = ", ".join(
            f"typeof({c})" for c in ("id", "tenant", "owner_user", "retry_of", "created_at", "started_at")
        )
        return [
            tuple(r)
            for r in conn.exec_driver_sql(f"SELECT {names}, queue_group FROM executions ORDER BY rowid")
        ]

    return _in_sync(url, read)


def _tick_twice(url: str) -> tuple[int, str]:
    """Insert one cron tick twice (ON CONFLICT DO NOTHING as the scheduler does, or a plain
    INSERT): how many rows it made, and the name of the unique index or constraint that refused
    the second. Rolled back."""

    def run(conn: sa.Connection) -> tuple[int, str]:
        row = {
            "id": new_id(),
            "flow_id": FLOW,
            "flow_version": 1,
            "trigger": "cron",
            "status": "queued",
            "created_at": datetime(2026, 12, 8, tzinfo=UTC),
            "scheduled_for": datetime(2026, 12, 8, tzinfo=UTC),
            "attempts": 0,
        }
        conn.execute(sa.insert(Execution).values(**row))
        table = Execution.__table__
        again = {**row, "id": new_id()}
        # The scheduler's statement at head; before 0026, the constraint's plain conflict target.
        index_where = sa.text(SCHEDULED) if migrate.current_revision(conn) == "0026" else None
        stmt = insert_ignore_for(conn.dialect.name, table, ["flow_id", "scheduled_for"], index_where)
        conn.execute(stmt.values(**again))
        made = int(
            conn.execute(
                sa.select(sa.func.count()).select_from(Execution).where(Execution.trigger == "cron")
            ).scalar_one()
        )
        try:
            with conn.begin_nested():
                conn.execute(sa.insert(Execution).values(**again))
            refused = ""
        except sa.exc.IntegrityError as exc:
            refused = "uq_executions_flow_id_scheduled_for" if "scheduled_for" in str(exc) else str(exc)
        conn.rollback()
        return made, refused

    return _in_sync(url, run)


def test_execution_rows_become_compact_and_read_the_same(empty_url: str) -> None:
    """0026: on SQLite an execution's own ids become 12 bytes (the flow's stays text), its times
    integers, a finished one's queue group goes, long log messages are packed. The values read
    through the model are those written before (but the finished rows' groups), the filters
    find them, and down to 0025 gives the text back."""
    sqlite = empty_url.startswith("sqlite")
    migrate.upgrade(empty_url, "0025")
    _fill(empty_url)
    when = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)

    def more(conn: sa.Connection) -> None:
        stamp: Any = when.replace(tzinfo=None).isoformat(sep=" ") if sqlite else when
        conn.execute(
            sa.text(
                "UPDATE executions SET queue_group = 'g', started_at = :c, finished_at = :c,"
                " retry_of = :r WHERE status != 'queued'"
            ),
            {"c": stamp, "r": f"{1:024x}"},
        )
        conn.execute(sa.text("UPDATE executions SET queue_group = 'g' WHERE status = 'queued'"))
        conn.execute(
            sa.text("UPDATE executions SET scheduled_for = :c WHERE id = :first"),
            {"c": stamp, "first": f"{0:024x}"},
        )
        conn.execute(
            sa.text(
                "INSERT INTO executions (id, flow_id, flow_version, tenant, owner_user, trigger, status,"
                " created_at, attempts, queue_group)"
                " VALUES (:id, :f, 1, :t, 'E-1', 'manual', 'running', :c, 1, 'g')"
            ),
            {"id": "exec-of-another-form", "f": FLOW, "t": HEX_TENANT, "c": stamp},
        )
        # A waiting sub-flow (its due time, its caller) keeps its group; a cancelled re-run
        # (its lease, its origin) does not.
        for eid, status, extra in (
            (f"{100:024x}", "waiting", "resume_at = :c, parent_execution_id = :o"),
            (f"{101:024x}", "cancelled", "lease_expires_at = :c, rerun_of = :o, started_at = :c"),
        ):
            conn.execute(
                sa.text(
                    "INSERT INTO executions (id, flow_id, flow_version, owner_user, trigger, status,"
                    " created_at, attempts, queue_group) VALUES (:id, :f, 1, :u, 'manual', :s, :c, 1, 'g')"
                ),
                {"id": eid, "f": FLOW, "u": LONER, "s": status, "c": stamp},
            )
            conn.execute(
                sa.text(f"UPDATE executions SET {extra} WHERE id = :id"),
                {"c": stamp, "o": f"{2:024x}", "id": eid},
            )
        conn.execute(
            sa.text("INSERT INTO logs (timestamp, level, message) VALUES (:c, 'info', :m)"),
            {"c": time_cell(when) if sqlite else when, "m": SUMMARY},
        )
        conn.commit()

    _in_sync(empty_url, more)
    before = _executions(empty_url)
    raw_before = _execution_cells(empty_url) if sqlite else None
    migrate.upgrade(empty_url, "0026")
    after = _executions(empty_url)
    # SQLite: a finished row's group is cleared (PostgreSQL keeps the old rows' groups).
    finished = {("failed", "g"), ("succeeded", "g"), ("cancelled", "g")} if sqlite else set()
    expected = [
        (*row[:-1], None if (row[-2], row[-1]) in finished else row[-1]) if i < len(before) - 1 else row
        for i, row in enumerate(before)
    ]
    assert after == expected
    assert after[-1][-1] == SUMMARY
    if sqlite:
        kinds = {c[:-1] for c in _execution_cells(empty_url)}
        # Hex ids as bytes (the fill's tenants "ttt…" and "uuu…", the odd row's id and owner stay
        # text), times as integers.
        assert kinds == {
            ("blob", "text", "blob", "null", "integer", "null"),  # queued, of "ttt…"
            ("blob", "text", "blob", "blob", "integer", "integer"),  # failed, of "uuu…"
            ("blob", "null", "blob", "blob", "integer", "integer"),  # succeeded, of none
            ("text", "blob", "text", "null", "integer", "null"),  # the odd one, running
            ("blob", "null", "blob", "null", "integer", "null"),  # waiting, of none
            ("blob", "null", "blob", "null", "integer", "integer"),  # cancelled, of none
        }, kinds
        messages = _in_sync(
            empty_url,
            lambda conn: conn.exec_driver_sql("SELECT DISTINCT typeof(message) FROM logs").scalars().all(),
        )
        assert sorted(messages) == ["blob", "text"]  # the summary packed, "ran" as it was

    def found(conn: sa.Connection) -> dict[str, int]:
        def count(*where: Any) -> int:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(Execution).where(*where)).scalar_one()
            )

        return {
            "one": count(Execution.id == f"{4:024x}"),
            "odd": count(Execution.id == "exec-of-another-form", Execution.tenant == HEX_TENANT),
            "t1": count(Execution.tenant == T1),
            "loner": count(Execution.owner_user == LONER),
            "retries": count(Execution.retry_of == f"{1:024x}"),
            "rerun": count(Execution.rerun_of == f"{2:024x}", Execution.lease_expires_at == when),
            "called": count(Execution.parent_execution_id == f"{2:024x}", Execution.resume_at == when),
            "since": count(Execution.finished_at >= when),
            "scheduled": count(Execution.flow_id == FLOW, Execution.scheduled_for == when),
            "grouped": count(Execution.queue_group == "g"),
        }

    assert _in_sync(empty_url, found) == {
        "grouped": 12 if sqlite else 33,  # the queued rows, the running one, the waiting one
        "one": 1,
        "odd": 1,
        "t1": 10,
        "loner": 32,
        "retries": 20,
        "rerun": 1,
        "called": 1,
        "since": 20,
        "scheduled": 1,
    }
    assert _tick_twice(empty_url) == (1, "uq_executions_flow_id_scheduled_for")

    def unique(conn: sa.Connection) -> list[tuple[Any, ...]]:
        return [
            (
                ix["column_names"],
                " ".join(str(v) for k, v in ix.get("dialect_options", {}).items() if "where" in k),
            )
            for ix in sa.inspect(conn).get_indexes("executions")
            if ix["name"] == "uq_executions_flow_id_scheduled_for"
        ]

    # A partial index now: the rows of other triggers (no scheduled time) are not in it; the
    # table constraint is gone.
    ((columns, where),) = _in_sync(empty_url, unique)
    constraints = _in_sync(empty_url, lambda conn: sa.inspect(conn).get_unique_constraints("executions"))
    assert constraints == []
    assert columns == ["flow_id", "scheduled_for"] and "scheduled_for IS NOT NULL" in where
    migrate.downgrade(empty_url, "0025")
    assert _executions(empty_url) == expected
    assert _tick_twice(empty_url) == (1, "uq_executions_flow_id_scheduled_for")
    if sqlite:
        down = _execution_cells(empty_url)
        assert {c[:-1] for c in down} == {c[:-1] for c in raw_before or []}
        assert all(c[4] == "text" for c in down)
    migrate.upgrade(empty_url, "0026")
    assert _executions(empty_url) == expected
