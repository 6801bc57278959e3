"""Process heartbeats: one row per engine process, renewed every
``FLOWYARD_HEARTBEAT_SECONDS``; the only module that writes ``process_heartbeats``.

A row's id is the process's worker id, the ``lease_owner`` of every execution it
holds, so the work of a process is attributable to it. A process whose heartbeat
is older than ``FLOWYARD_HEARTBEAT_TIMEOUT_SECONDS`` is dead: whoever sees it first
deletes its row and (in the same transaction, see ``Worker``) takes its executions
back, seconds after a crash instead of a lease later.

Exactly once: the row is deleted with ``DELETE ... WHERE beat_at < cutoff
RETURNING id``, and only the processes that statement returns lose their work. A
slow process whose renewal lands first keeps its row (PostgreSQL re-checks the
condition on the locked row); one whose renewal comes after finds its row gone,
knows it was declared dead and takes a new id, so it never records an outcome for
an execution released meanwhile (``queue.complete`` checks the holder).

Times come from the database's clock on PostgreSQL (``dialect.db_now``), so
processes on machines with skewed clocks agree; SQLite is one machine's file.
On SQLite every process shares one host, so a row of this host whose pid no
longer exists is dead at once (a restarted ``serve`` takes back its previous
instance's work as it starts, without waiting for the timeout).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, UTCDateTime
from flowyard.db.dialect import db_now, dialect_name
from flowyard.queue.trigger_lease import TriggerLease


class ProcessHeartbeat(Base):
    __tablename__ = "process_heartbeats"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    host: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    pid: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    beat_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, index=True)


def host_name() -> str:
    return socket.gethostname()


async def beat(session: AsyncSession, process_id: str) -> bool:
    """Renew this process's heartbeat. False: the row was missing (first beat, or another
    process declared this one dead and took its executions); it is written anew."""
    now = await db_now(session)
    renewed = await session.execute(
        sa.update(ProcessHeartbeat)
        .where(ProcessHeartbeat.id == process_id)
        .values(beat_at=now)
        .execution_options(synchronize_session=False)
    )
    if int(renewed.rowcount or 0):  # type: ignore[attr-defined]
        return True
    session.add(
        ProcessHeartbeat(id=process_id, host=host_name(), pid=os.getpid(), started_at=now, beat_at=now)
    )
    await session.flush()
    return False


async def remove(session: AsyncSession, process_id: str) -> None:
    """A process stopping cleanly takes its row with it."""
    await session.execute(sa.delete(ProcessHeartbeat).where(ProcessHeartbeat.id == process_id))


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _pid_gone(pid: int, row_started: datetime) -> bool:
    """Is the process of a heartbeat row of this host gone? Yes if no process has its pid, if it
    is a zombie (killed, its parent has not reaped it yet), or if the process now holding the pid
    started after the row did (the pid was reused, as in a restarted container, where a new
    process gets the same small pid). Unsure (no procfs): no, and the heartbeat timeout decides."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return True
    boot = _boot_time()
    if boot is None:
        return False
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time
    # The boot time is whole seconds: a margin of one, so a live holder is never taken for dead.
    return started > row_started.timestamp() + 1.0


async def take_dead(session: AsyncSession, *, me: str, after_seconds: float) -> list[str]:
    """Delete the rows of dead processes and return their ids (the caller releases their
    executions in the same transaction). Never this process's own row."""
    now = await db_now(session)
    dead = sa.and_(
        ProcessHeartbeat.id != me, ProcessHeartbeat.beat_at < now - timedelta(seconds=after_seconds)
    )
    if dialect_name(session) == "sqlite":
        local: Sequence[tuple[str, int, datetime]] = (
            await session.execute(
                sa.select(ProcessHeartbeat.id, ProcessHeartbeat.pid, ProcessHeartbeat.started_at).where(
                    ProcessHeartbeat.host == host_name(), ProcessHeartbeat.id != me
                )
            )
        ).all()
        gone = [pid_id for pid_id, pid, started in local if _pid_gone(pid, started)]
        if gone:
            dead = sa.or_(dead, ProcessHeartbeat.id.in_(gone))
    taken = await session.scalars(sa.delete(ProcessHeartbeat).where(dead).returning(ProcessHeartbeat.id))
    return sorted(taken.all())


async def free_trigger_leases(session: AsyncSession, holders: list[str]) -> list[str]:
    """Free the leases of processes whose heartbeat stopped (the caller deleted their heartbeat
    rows in this transaction, so exactly one process frees them); returns the flows freed. A
    live engine then takes each with ``take`` like any free lease."""
    if not holders:
        return []
    freed = await session.scalars(
        sa.update(TriggerLease)
        .where(TriggerLease.holder.in_(holders))
        .values(holder=None, expires_at=None, subscribed_at=None)
        .returning(TriggerLease.flow_id)
        .execution_options(synchronize_session=False)
    )
    return sorted(freed.all())
