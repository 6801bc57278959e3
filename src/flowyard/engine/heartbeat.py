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


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A killed process that its parent has not reaped yet (a zombie) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False  # no procfs (not Linux): the heartbeat timeout decides
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


async def take_dead(session: AsyncSession, *, me: str, after_seconds: float) -> list[str]:
    """Delete the rows of dead processes and return their ids (the caller releases their
    executions in the same transaction). Never this process's own row."""
    now = await db_now(session)
    dead = sa.and_(
        ProcessHeartbeat.id != me, ProcessHeartbeat.beat_at < now - timedelta(seconds=after_seconds)
    )
    if dialect_name(session) == "sqlite":
        local: Sequence[tuple[str, int]] = (
            await session.execute(
                sa.select(ProcessHeartbeat.id, ProcessHeartbeat.pid).where(
                    ProcessHeartbeat.host == host_name(), ProcessHeartbeat.id != me
                )
            )
        ).all()
        gone = [pid_id for pid_id, pid in local if _pid_gone(pid)]
        if gone:
            dead = sa.or_(dead, ProcessHeartbeat.id.in_(gone))
    taken = await session.scalars(sa.delete(ProcessHeartbeat).where(dead).returning(ProcessHeartbeat.id))
    return sorted(taken.all())
