"""``flowyard check``: is this deployment's database in a state to run on?

Read-only: it connects, reads and reports; it never migrates, reaps or repairs. Each check is
``ok`` or not; the command exits non-zero when one is not.

- ``database``: reachable (SQLite: the file exists and opens).
- ``schema``: the revision recorded in the database and the migrations this code would apply
  (``flowyard migrate``); a revision this code does not know fails too (a newer flowyard wrote it).
- ``integrity``: ``PRAGMA integrity_check`` (``--quick``: ``quick_check``) on SQLite; PostgreSQL
  checks its own pages, so it is not applicable there.
- ``queue``: queued and running executions and the age of the oldest queued one (information).
- ``leases``: running executions whose lease expired more than ``stuck_after`` seconds ago. A live
  engine re-queues an expired lease within half a lease (its reaper's period), so such rows mean
  that no engine is running on this database, or that it cannot write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from flowyard.clock import isoformat, utcnow
from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.db.session import Database
from flowyard.executions.models import Execution
from flowyard.ops.backup import inspect, sqlite_file


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


async def check(settings: Settings, *, quick: bool = False, stuck_after: float | None = None) -> Report:
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


def render(report: Report) -> str:
    lines = [f"database {report.database}"]
    for c in report.checks:
        lines.append(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:10} {c.summary}")
    lines.append("all checks passed" if report.ok else "some checks failed")
    return "\n".join(lines)
