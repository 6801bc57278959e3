"""``flowyard check``: is this deployment's database in a state to run on?

Read-only: it connects, reads and reports; it never migrates, reaps or repairs (but with
``--quarantine``, below). Each check is ``ok`` or not; the command exits non-zero when one is not.

- ``database``: reachable (SQLite: the file exists and opens).
- ``schema``: the revision recorded in the database and the migrations this code would apply
  (``flowyard migrate``); a revision this code does not know fails too (a newer flowyard wrote it).
- ``integrity``: ``PRAGMA integrity_check`` (``--quick``: ``quick_check``) on SQLite; PostgreSQL
  checks its own pages, so it is not applicable there.
- ``queue``: queued and running executions and the age of the oldest queued one (information).
- ``leases``: running executions whose lease expired more than ``stuck_after`` seconds ago. A live
  engine re-queues an expired lease within half a lease (its reaper's period), so such rows mean
  that no engine is running on this database, or that it cannot write.
- ``json``: every JSON cell reads back (flowyard.jsonvalue): it is JSON orjson parses (PostgreSQL's
  ``json`` type also takes ``1e400`` and lone surrogate escapes, and a raw write can put anything
  in a SQLite cell) and nests no deeper than the store writes (``MAX_DEPTH``; an execution's
  result and steps wrap it in up to 3 more levels). Each unreadable cell is named: table, row,
  column and why. ``quarantine=True`` (``flowyard check --quarantine``) replaces each with a JSON
  string holding its raw text, so nothing is lost and the row reads again, and fails the queued
  or running executions whose input it was; the report then shows the database after that.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import orjson
import sqlalchemy as sa

from flowyard.clock import isoformat, utcnow
from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.db import packed as packed_cells
from flowyard.db.session import Database
from flowyard.flows import counts as flow_counts
from flowyard.jsonvalue import MAX_DEPTH, depth_exceeds
from flowyard.models import metadata
from flowyard.ops.backup import inspect, sqlite_file
from flowyard.queue import store as engine_queue
from flowyard.queue.models import Execution


@dataclass
class Check:
    name: str
    ok: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    database: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "database": self.database,
            "checks": {c.name: {"ok": c.ok, "summary": c.summary, **c.details} for c in self.checks},
        }


async def check(
    settings: Settings,
    *,
    quick: bool = False,
    stuck_after: float | None = None,
    quarantine: bool = False,
    recount: bool = False,
) -> Report:
    url = sa.make_url(settings.resolved_database_url())
    shown = url.render_as_string(hide_password=True)
    report = Report(shown, [])
    checks = report.checks
    database_file = sqlite_file(settings)
    if database_file is not None and not database_file.exists():
        # Opening it would create an empty database: report it missing instead.
        checks.append(Check("database", False, f"no database file at {database_file}"))
        return report
    db = Database(settings.resolved_database_url(), pool_size=1)
    try:
        try:
            async with db.engine.connect() as conn:
                revision = await conn.run_sync(migrate.current_revision)
        except Exception as exc:  # any failure to connect is the finding
            checks.append(Check("database", False, f"unreachable: {type(exc).__name__}: {exc}"))
            return report
        checks.append(Check("database", True, "reachable"))
        checks.append(_schema(revision))

        if database_file is not None:
            found = inspect(database_file, quick=quick)
            checks.append(
                Check(
                    "integrity",
                    found.ok,
                    "ok" if found.ok else f"{len(found.integrity)} problems: {found.integrity[0]}",
                    {"messages": found.integrity[:20]},
                )
            )
        else:
            checks.append(Check("integrity", True, "not applicable (PostgreSQL)"))

        if revision is None:
            return report  # no tables to count in
        async with db.read() as session:
            checks.append(await _queue(session))
            lease_grace = settings.lease_seconds if stuck_after is None else stuck_after
            checks.append(await _leases(session, lease_grace))
        if _schema(revision).ok:  # else the columns may not be there yet: schema says migrate
            checks.append(await _json(db, quarantine=quarantine))
            checks.append(await _flow_counts(db, recount=recount))
    finally:
        await db.dispose()
    return report


def _schema(revision: str | None) -> Check:
    head = migrate.script_head()
    try:
        pending = migrate.pending_revisions(revision)
    except LookupError:
        return Check(
            "schema",
            False,
            f"revision {revision} is unknown to this flowyard (head {head}): a newer version migrated it",
            {"revision": revision, "head": head, "pending": None},
        )
    details = {"revision": revision, "head": head, "pending": pending}
    if pending:
        return Check(
            "schema",
            False,
            f"revision {revision or 'none'}, {len(pending)} pending migrations "
            f"({', '.join(pending)}): run flowyard migrate",
            details,
        )
    return Check("schema", True, f"revision {revision} (head)", details)


async def _queue(session: Any) -> Check:
    rows = await session.execute(
        sa.select(Execution.status, sa.func.count(), sa.func.min(Execution.created_at))
        .where(Execution.status.in_(("queued", "running")))
        .group_by(Execution.status)
    )
    counts = {"queued": 0, "running": 0}
    oldest = None
    for status, count, first in rows:
        counts[status] = int(count)
        if status == "queued":
            oldest = first
    age = round((utcnow() - oldest).total_seconds(), 3) if oldest is not None else None
    summary = f"{counts['queued']} queued, {counts['running']} running"
    if age is not None:
        summary += f", oldest queued {age:.0f} s ago"
    return Check("queue", True, summary, {**counts, "oldestQueuedAgeSeconds": age})


async def _leases(session: Any, grace: float) -> Check:
    now = utcnow()
    cutoff = now - timedelta(seconds=grace)
    count, oldest = (
        await session.execute(
            sa.select(sa.func.count(), sa.func.min(Execution.lease_expires_at)).where(
                Execution.status == "running", Execution.lease_expires_at < cutoff
            )
        )
    ).one()
    details = {
        "stuck": int(count),
        "stuckAfterSeconds": grace,
        "oldestExpiredAt": isoformat(oldest) if oldest is not None else None,
    }
    if count:
        return Check(
            "leases",
            False,
            f"{count} running executions whose lease expired over {grace:g} s ago: "
            "is an engine (flowyard serve or worker) running?",
            details,
        )
    return Check("leases", True, "no stuck leases", details)


RECOUNT_COMMAND = "flowyard check --recount"


async def _flow_counts(db: Database, *, recount: bool) -> Check:
    """The flow lists' totals (flows/counts.py) against the flows themselves; ``recount``
    rebuilds them when they differ (a write made by hand, past the flows module)."""
    async with db.read() as session:
        differ = await flow_counts.drift(session)
    if differ and recount:
        async with db.write() as session:
            fixed = await flow_counts.recount(session)
        return Check(
            "flowCounts",
            True,
            f"recounted: {fixed} counter rows differed from the flows",
            {"recounted": fixed},
        )
    if differ:
        shown = [
            {"user": u, "tenant": t, "status": s, "type": ty, "kept": kept, "counted": counted}
            for (u, t, s, ty), (kept, counted) in sorted(differ.items())[:_SHOWN]
        ]
        return Check(
            "flowCounts",
            False,
            f"{len(differ)} counter rows of the flow lists differ from the flows: run {RECOUNT_COMMAND}",
            {"differ": len(differ), "rows": shown},
        )
    return Check("flowCounts", True, "the flow lists' counts agree with the flows", {"differ": 0})


# Deeper than MAX_DEPTH only where the store wraps a value: a result is {"data": value} or
# {"reply": {"body": value}}, a steps document [{"output": [value, ...]}, ...].
_WRAPPED = {("executions", "result"): 2, ("executions", "steps"): 3}
_PAGE = 1000
_SHOWN = 50
QUARANTINE_COMMAND = "flowyard check --quarantine"


@dataclass
class BadCell:
    table: str
    key: Any
    column: str
    why: str
    raw: Any

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "id": self.key, "column": self.column, "why": self.why}

    def __str__(self) -> str:
        return f"{self.table} {self.key} {self.column}: {self.why}"


def _cell_problem(raw: Any, limit: int, packed: bool = False) -> str | None:
    """Why a stored JSON cell (its raw text, or a number SQLite kept, or the BLOB of a packed
    column: db/packed.py) cannot be read and served."""
    if raw is None or isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return None if math.isfinite(raw) else f"a number JSON cannot hold ({raw!r})"
    if isinstance(raw, bytes) and packed:
        try:
            value = packed_cells.unpack_checked(raw)
        except orjson.JSONDecodeError as exc:
            return f"not JSON orjson reads once inflated ({exc.msg}, at character {exc.pos})"
        except (ValueError, zlib.error) as exc:
            return f"a packed value that cannot be inflated ({exc})"
        return f"nests deeper than {limit} levels" if depth_exceeds(value, limit) else None
    if isinstance(raw, bytes):
        return "bytes, not text"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"not JSON orjson reads ({exc.msg}, at character {exc.pos})"
    if raw.count("[") + raw.count("{") > limit and depth_exceeds(value, limit):
        return f"nests deeper than {limit} levels"
    return None


def _json_tables() -> list[tuple[sa.Table, list[sa.Column[Any]]]]:
    out = []
    for table in metadata.sorted_tables:
        columns = [c for c in table.columns if isinstance(c.type, sa.JSON | packed_cells.PackedJson)]
        if columns:
            out.append((table, columns))
    return out


async def find_bad_cells(db: Database) -> list[BadCell]:
    """Every JSON cell that cannot be read back, table by table, a page of rows at a time."""
    bad: list[BadCell] = []
    for table, columns in _json_tables():
        keys = list(table.primary_key.columns)
        # The stored text, not the value: PostgreSQL's driver would parse a json column itself
        # (and fail on the very cells looked for), so it casts; SQLite's cell is as it is.
        # A packed column's SQLite cell is a BLOB (or JSON text written before packing): as it is.
        coerce = sa.type_coerce if db.is_sqlite else sa.cast
        raw = [
            (packed_cells.raw_cell(c, sqlite=True) if _packed(c, db) else coerce(c, sa.UnicodeText())).label(
                c.name
            )
            for c in columns
        ]
        last: tuple[Any, ...] | None = None
        while True:
            query = sa.select(*keys, *raw).order_by(*keys).limit(_PAGE)
            if last is not None:
                # Bound as the keys' own types: a compact id (db/compact.py) is compared as the
                # bytes it is stored as, never as its text (a BLOB sorts after every text).
                after = [sa.literal(v, type_=k.type) for k, v in zip(keys, last, strict=True)]
                query = query.where(sa.tuple_(*keys) > sa.tuple_(*after))
            async with db.read() as session:
                rows = (await session.execute(query)).all()
            for row in rows:
                key = row[0] if len(keys) == 1 else list(row[: len(keys)])
                for column, value in zip(columns, row[len(keys) :], strict=True):
                    limit = MAX_DEPTH + _WRAPPED.get((table.name, column.name), 0)
                    why = _cell_problem(value, limit, packed=_packed(column, db))
                    if why is not None:
                        bad.append(BadCell(table.name, key, column.name, why, value))
            if len(rows) < _PAGE:
                break
            last = tuple(rows[-1][: len(keys)])
    return bad


def _packed(column: sa.Column[Any], db: Database) -> bool:
    return db.is_sqlite and isinstance(column.type, packed_cells.PackedJson)


async def quarantine_cells(db: Database, bad: list[BadCell]) -> list[str]:
    """Replace each bad cell with a JSON string of its raw text; fail the unfinished executions
    whose input was one. Returns the executions failed."""
    tables = {t.name: t for t, _ in _json_tables()}
    failed: list[str] = []
    async with db.write() as session:
        for cell in bad:
            table = tables[cell.table]
            keys = list(table.primary_key.columns)
            values = [cell.key] if len(keys) == 1 else cell.key
            text = cell.raw if isinstance(cell.raw, str) else repr(cell.raw)
            await session.execute(
                sa.update(table)
                .where(*(k == v for k, v in zip(keys, values, strict=True)))
                .values({cell.column: text})
            )
        inputs = {str(c.key): c.why for c in bad if (c.table, c.column) == ("executions", "input")}
        for eid, why in sorted(inputs.items()):
            reason = (
                f"its input could not be read ({why}); {QUARANTINE_COMMAND} kept its raw text as "
                "a JSON string in the input"
            )
            failed += await engine_queue.fail_unfinished(session, [eid], reason)
    return failed


async def _json(db: Database, *, quarantine: bool) -> Check:
    bad = await find_bad_cells(db)
    done: dict[str, Any] = {}
    if bad and quarantine:
        failed = await quarantine_cells(db, bad)
        done = {
            "quarantined": [c.as_dict() for c in bad[:_SHOWN]],
            "quarantinedCount": len(bad),
            "failedExecutions": failed,
        }
        bad = await find_bad_cells(db)
    details = {"unreadable": [c.as_dict() for c in bad[:_SHOWN]], "count": len(bad), **done}
    if bad:
        shown = "; ".join(str(c) for c in bad[:3]) + ("; ..." if len(bad) > 3 else "")
        return Check(
            "json",
            False,
            f"{len(bad)} JSON cells cannot be read: {shown}. {QUARANTINE_COMMAND} keeps each as a "
            "JSON string of its raw text and fails the unfinished executions whose input it was",
            details,
        )
    if done:
        return Check(
            "json",
            True,
            f"quarantined {done['quarantinedCount']} JSON cells, failed {len(done['failedExecutions'])} "
            "executions; every JSON cell reads",
            details,
        )
    return Check("json", True, "every JSON cell reads", details)


def render(report: Report) -> str:
    lines = [f"database {report.database}"]
    for c in report.checks:
        lines.append(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:10} {c.summary}")
    lines.append("all checks passed" if report.ok else "some checks failed")
    return "\n".join(lines)
