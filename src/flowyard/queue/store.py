"""The durable work queue: executions are rows. A trigger is a committed row
before it is acknowledged; workers claim rows with a lease; a dead worker's
lease expires and the reaper puts its rows back in the queue.

PostgreSQL claims with ``FOR UPDATE SKIP LOCKED`` so many workers never wait
on one another; SQLite has one writer at a time (``BEGIN IMMEDIATE``), which
makes the same UPDATE a safe single claimer.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import isolate
from flowyard.clock import utcnow
from flowyard.db import packed
from flowyard.db.dialect import dialect_name, insert_ignore
from flowyard.db.prepared import Prepared, insert_into
from flowyard.flows.models import Flow
from flowyard.flows.status import FlowStatus
from flowyard.iam.visibility import owner_user_of, shares_owner
from flowyard.ids import new_id
from flowyard.logs.append import append as append_logs
from flowyard.logs.append import entry as log_entry
from flowyard.queue import counters, steps, subflows
from flowyard.queue import status as execution_status
from flowyard.queue.models import QUEUED_ROWS, RUNNING_ROWS, SCHEDULED, Execution
from flowyard.queue.records import Claimed, Outcome, StepRecord  # noqa: F401 - re-exported
from flowyard.queue.status import UNFINISHED, ExecutionStatus

# Core tables for the hot paths: executemany INSERT/UPDATE without the ORM's bulk machinery.
_EXECUTIONS = cast(sa.Table, Execution.__table__)
RUNNING, QUEUED = ExecutionStatus.RUNNING, ExecutionStatus.QUEUED


@dataclass
class NewExecution:
    id: str
    flow_id: str
    flow_version: int
    flow_name: str
    tenant: str | None
    owner_user: str | None
    trigger: str
    input: Any
    created_at: datetime
    scheduled_for: datetime | None = None
    # SPEC §11: the continuation a replay starts from (queue/continuation.py), and the
    # execution it comes from (a retry, a re-run, or the failure that started an error flow).
    state: Any = None
    retry_of: str | None = None
    rerun_of: str | None = None
    parent_execution_id: str | None = None
    # The flow's version (flows.history_version, SPEC §12); None: read from the flow at enqueue.
    history_version: int | None = None

    def extras(self) -> dict[str, Any]:
        """The optional columns this execution sets (none for a trigger's execution)."""
        values = {
            "state": self.state,
            "retry_of": self.retry_of,
            "rerun_of": self.rerun_of,
            "parent_execution_id": self.parent_execution_id,
        }
        return {k: v for k, v in values.items() if v is not None}


def queue_group_of(tenant: str | None, owner_user: str | None) -> str:
    """The unit of fair sharing: a tenant, or the owner of tenantless flows."""
    if tenant:
        return f"t:{tenant}"
    return f"u:{owner_user}" if owner_user else "-"


_FLOWS = cast(sa.Table, Flow.__table__)
_LAST_EXECUTION = Prepared(
    sa.update(_FLOWS).where(_FLOWS.c.id == sa.bindparam("fid")).values(last_execution_at=sa.bindparam("when"))
)


async def enqueue(
    session: AsyncSession,
    items: Sequence[NewExecution],
    *,
    skip_duplicates: bool = False,
    count: bool = True,
) -> list[str]:
    """Insert queued executions and count them, in the caller's transaction.

    With ``skip_duplicates`` a row whose (flow, scheduled time) exists already is
    skipped (another scheduler got there first) and not counted. ``count=False``: not
    counted at all (their count could not be written: ``isolate.py``).
    """
    if not items:
        return []
    unknown = {e.flow_id for e in items if e.history_version is None}
    versions: dict[str, int] = {}
    if unknown:
        versions = dict(
            (
                await session.execute(sa.select(Flow.id, Flow.history_version).where(Flow.id.in_(unknown)))
            ).all()
        )
    rows = [
        {
            "id": e.id,
            "flow_id": e.flow_id,
            "flow_version": e.flow_version,
            "history_version": e.history_version
            if e.history_version is not None
            else versions.get(e.flow_id),
            "tenant": e.tenant,
            "owner_user": e.owner_user,
            "trigger": e.trigger,
            "status": ExecutionStatus.QUEUED,
            "input": e.input,
            "created_at": e.created_at,
            "scheduled_for": e.scheduled_for,
            "attempts": 0,
            "queue_group": queue_group_of(e.tenant, e.owner_user),
            **e.extras(),
        }
        for e in items
    ]
    inserted = items
    if skip_duplicates:
        kept = []
        for e, row in zip(items, rows, strict=True):
            stmt = insert_ignore(session, Execution, ["flow_id", "scheduled_for"], sa.text(SCHEDULED)).values(
                **row
            )
            result = await session.execute(stmt)
            if result.rowcount == 1:  # type: ignore[attr-defined]
                kept.append(e)
        inserted = kept
    else:
        # Rows setting optional columns (replays, error flows: rare) one by one; an executemany
        # needs the same columns in every row.
        plain = [row for e, row in zip(items, rows, strict=True) if not e.extras()]
        if plain:
            await insert_into(_EXECUTIONS, tuple(plain[0])).many(session, plain)
        for e, row in zip(items, rows, strict=True):
            if e.extras():
                await session.execute(sa.insert(_EXECUTIONS), [row])
    counts: Counter[tuple[Any, str]] = Counter()
    info: dict[str, NewExecution] = {}
    latest: dict[str, datetime] = {}
    for e in inserted:
        if count:
            counts[(e.created_at.date(), e.flow_id)] += 1
        info[e.flow_id] = e
        latest[e.flow_id] = max(latest.get(e.flow_id, e.created_at), e.created_at)
    await counters.add_flow_counts(
        session,
        [
            {
                "day": day,
                "flow_id": fid,
                "tenant": info[fid].tenant,
                "user_id": info[fid].owner_user,
                "flow_name": info[fid].flow_name,
                "executions": n,
            }
            for (day, fid), n in counts.items()
        ],
    )
    for fid, when in sorted(latest.items()):
        await _LAST_EXECUTION.run(session, {"fid": fid, "when": when})
    return [e.id for e in inserted]


# Groups with queued work and the oldest queued id of each: a loose index scan over
# ix_executions_queued_group_id, one index probe per group, however long the queue is.
_QUEUED_GROUPS = Prepared(
    sa.text(
        """
    WITH RECURSIVE g(grp) AS (
        SELECT (SELECT queue_group FROM executions
                WHERE status = 'queued' AND queue_group IS NOT NULL ORDER BY queue_group LIMIT 1)
        UNION ALL
        SELECT (SELECT e.queue_group FROM executions e
                WHERE e.status = 'queued' AND e.queue_group > g.grp ORDER BY e.queue_group LIMIT 1)
        FROM g WHERE g.grp IS NOT NULL
    )
    SELECT grp, (SELECT e.id FROM executions e
                 WHERE e.status = 'queued' AND e.queue_group = g.grp ORDER BY e.id LIMIT 1)
    FROM g WHERE grp IS NOT NULL
    """
    ).columns(sa.column("grp", Execution.queue_group.type), sa.column("id", Execution.id.type))
)


# From ix_executions_running_group_id alone (its predicate written as the index writes it).
_RUNNING = (
    sa.select(Execution.queue_group, sa.func.count())
    .where(sa.text(RUNNING_ROWS))
    .group_by(Execution.queue_group)
)


def _running_statement(*, groups: bool, finished: bool) -> sa.Executable:
    """The running counts, of the ``:groups`` only, leaving out the ``:finished`` ids."""
    counts = _RUNNING
    if groups:
        counts = counts.where(Execution.queue_group.in_(sa.bindparam("groups", expanding=True)))
    if finished:
        counts = counts.where(Execution.id.not_in(sa.bindparam("finished", expanding=True)))
    return counts


_RUNNING_COUNTS = {
    (g, f): Prepared(_running_statement(groups=g, finished=f)) for g in (False, True) for f in (False, True)
}


async def _running_by_group(
    session: AsyncSession, groups: Iterable[str] | None = None, finished: Sequence[str] = ()
) -> dict[str | None, int]:
    """Executions running now (in the database: every process's), by queue group; ``finished``
    (ids whose run ended, their outcome not yet recorded) are not counted."""
    params: dict[str, Any] = {}
    if groups is not None:
        params["groups"] = list(groups)
    if finished:
        params["finished"] = list(finished)
    rows = await _RUNNING_COUNTS[(groups is not None, bool(finished))].all(session, params)
    return {grp: int(n) for grp, n in rows}


def _limit(dialect: str) -> sa.BindParameter[int]:
    """``:n`` rows. On PostgreSQL written into the SQL as a number: a prepared statement's
    generic plan would guess the limit (a tenth of the rows) and may sort a backlog rather
    than walk the ``(status, ...)`` index; SQLite plans each statement as it runs."""
    return sa.bindparam("n", type_=sa.Integer(), literal_execute=dialect == "postgresql")


def _pick_statement(*, taken: bool) -> Callable[[str], sa.Executable]:
    """The next ``:n`` queued ids of queue group ``:grp`` (not among ``:taken``); PostgreSQL
    skips rows another claimer has locked."""

    def build(dialect: str) -> sa.Executable:
        pick = (
            sa.select(Execution.id)
            .where(sa.text(QUEUED_ROWS), Execution.queue_group == sa.bindparam("grp"))
            .order_by(Execution.id)
            .limit(_limit(dialect))
        )
        if taken:
            pick = pick.where(Execution.id.not_in(sa.bindparam("taken", expanding=True)))
        if dialect == "postgresql":
            pick = pick.with_for_update(skip_locked=True)
        return pick

    return build


_PICK = Prepared(_pick_statement(taken=False))
_PICK_MORE = Prepared(_pick_statement(taken=True))


async def _pick_fairly(
    session: AsyncSession,
    limit: int,
    *,
    cap: int,
    held_back: set[str],
    running_seen: dict[str | None, int] | None = None,
    finished: Sequence[str] = (),
) -> list[tuple[str, str | None]]:
    """Up to ``limit`` queued executions (id, queue group), shared fairly across queue groups.

    Each slot goes to the group running the fewest executions now (counting those
    this claim takes), ties to the group whose oldest queued execution is oldest:
    a tenant with a backlog of thousands takes no slot from one with a single new
    execution, and no group waits behind another's backlog. A group with fewer
    queued rows than its share leaves the rest to the others; anything still
    unfilled goes to the oldest queued rows.

    ``cap`` (0: none): a group running ``cap`` executions gets no more; those left queued
    are added to ``held_back``. This only picks well; ``claim`` enforces the cap.
    ``running_seen`` receives the running counts it read (by group).
    """
    heads = {grp: head for grp, head in await _QUEUED_GROUPS.all(session)}
    if not heads:
        return []
    running = await _running_by_group(session, finished=finished)
    if running_seen is not None:
        running_seen.update(running)
    load = {grp: running.get(grp, 0) for grp in heads}
    picked: list[tuple[str, str | None]] = []
    taken: list[str] = []
    open_groups = set(heads)
    if cap:
        full = {g for g in open_groups if load[g] >= cap}
        held_back.update(full)
        open_groups -= full
    while len(picked) < limit and open_groups:
        # Water-filling: each slot to the least loaded group (a heap: many groups stay cheap).
        want: Counter[str] = Counter()
        heap = [(load[g], heads[g], g) for g in open_groups]
        heapq.heapify(heap)
        for _ in range(limit - len(picked)):
            if not heap:
                break  # every open group is at its cap
            n, head, grp = heapq.heappop(heap)
            want[grp] += 1
            if not cap or n + 1 < cap:
                heapq.heappush(heap, (n + 1, head, grp))
        for grp in sorted(want, key=lambda g: heads[g]):
            if taken:
                found = await _PICK_MORE.all(session, {"grp": grp, "n": want[grp], "taken": taken})
            else:
                found = await _PICK.all(session, {"grp": grp, "n": want[grp]})
            ids = [i for (i,) in found]
            picked += [(i, grp) for i in ids]
            taken += ids
            load[grp] += len(ids)
            if len(ids) < want[grp]:
                open_groups.discard(grp)  # drained (or the rest is locked by another claimer)
            elif cap and load[grp] >= cap:
                open_groups.discard(grp)
                held_back.add(grp)  # at its cap, perhaps with more queued (claim checks again)
    if len(picked) < limit:
        skip_full = bool(cap and held_back)
        params: dict[str, Any] = {"n": limit - len(picked)}
        if taken:
            params["taken"] = taken
        if skip_full:
            params["full"] = sorted(held_back)
        rows = await _REST[(bool(taken), skip_full)].all(session, params)
        picked += [(i, g) for i, g in rows]
    return picked


def _rest_statement(*, taken: bool, full: bool) -> Callable[[str], sa.Executable]:
    """The oldest ``:n`` queued rows (not among ``:taken``, not of the ``:full`` groups); PostgreSQL
    skips rows another claimer has locked."""

    def build(dialect: str) -> sa.Executable:
        rest = (
            sa.select(Execution.id, Execution.queue_group)
            .where(Execution.status == QUEUED)
            .order_by(Execution.id)
            .limit(_limit(dialect))
        )
        if taken:
            rest = rest.where(Execution.id.not_in(sa.bindparam("taken", expanding=True)))
        if full:
            rest = rest.where(
                sa.or_(
                    Execution.queue_group.is_(None),
                    Execution.queue_group.not_in(sa.bindparam("full", expanding=True)),
                )
            )
        if dialect == "postgresql":
            rest = rest.with_for_update(skip_locked=True)
        return rest

    return build


_REST = {(t, f): Prepared(_rest_statement(taken=t, full=f)) for t in (False, True) for f in (False, True)}


# The namespace of the cap's advisory locks (a transaction-scoped lock per queue group).
_CAP_LOCK_SPACE = b"flowyard.queue.cap:"


def _cap_lock_key(group: str) -> int:
    """A signed 64-bit advisory-lock key for a queue group."""
    digest = hashlib.blake2b(_CAP_LOCK_SPACE + group.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# One statement takes the locks in the order of the array (a function scan yields its rows in
# order), so two claimers always lock shared groups in the same order: no deadlock.
_CAP_LOCKS = sa.text("SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS t(k)")


async def _within_cap(
    session: AsyncSession,
    picked: list[tuple[str, str | None]],
    cap: int,
    held_back: set[str],
    running_seen: dict[str | None, int] | None = None,
    finished: Sequence[str] = (),
) -> list[str]:
    """The ids of ``picked`` that keep each queue group within ``cap`` running executions,
    counted in the database now; the groups cut are added to ``held_back``.

    PostgreSQL: each group's count is taken under a transaction-scoped advisory lock of that
    group, held until this claim commits, so concurrent claimers (any process) count one after
    another and each sees what the one before it moved to running (READ COMMITTED: a statement
    sees what committed before it began). Transaction-scoped, so it works through PgBouncer in
    transaction mode. SQLite: this transaction is the only writer (BEGIN IMMEDIATE), so the
    counts ``_pick_fairly`` read earlier in it (``running_seen``) are still the counts: they
    are not read again.
    """
    if not cap or not picked:
        return [i for i, _g in picked]
    groups = sorted({g for _i, g in picked if g is not None})
    running: dict[str | None, int]
    if running_seen is not None and dialect_name(session) == "sqlite":
        running = {g: running_seen[g] for g in groups if g in running_seen}
    else:
        if groups and dialect_name(session) == "postgresql":
            keys = sorted({_cap_lock_key(g) for g in groups})
            await session.execute(_CAP_LOCKS, {"keys": keys})
        running = await _running_by_group(session, groups, finished)
    room = {g: cap - n for g, n in running.items()}
    kept: list[str] = []
    for eid, grp in picked:
        if grp is None:
            kept.append(eid)  # no group (rows from before queue groups): nothing to share
        elif room.get(grp, cap) > 0:
            room[grp] = room.get(grp, cap) - 1
            kept.append(eid)
        else:
            held_back.add(grp)
    return kept


_TIME = Execution.created_at.type
# Moves the picked rows to running under this worker's lease (the claim's one write).
_CLAIM = Prepared(
    execution_status.update(QUEUED, RUNNING)
    .where(Execution.id.in_(sa.bindparam("ids", expanding=True)))
    .values(
        lease_owner=sa.bindparam("owner"),
        lease_expires_at=sa.bindparam("expires", type_=_TIME),
        started_at=sa.func.coalesce(Execution.started_at, sa.bindparam("now", type_=_TIME)),
        attempts=Execution.attempts + 1,
    )
    .returning(
        Execution.id,
        Execution.flow_id,
        Execution.flow_version,
        Execution.history_version,
        Execution.tenant,
        Execution.owner_user,
        Execution.trigger,
        sa.cast(Execution.input, sa.Text).label("input"),
        Execution.attempts,
        Execution.created_at,
        Execution.scheduled_for,
        sa.cast(Execution.state, sa.Text).label("state"),
    )
    .execution_options(synchronize_session=False)
)


class _ClaimRow(NamedTuple):
    id: str
    flow_id: str
    flow_version: int
    history_version: int | None
    tenant: str | None
    owner_user: str | None
    trigger: str
    input: str | None
    attempts: int
    created_at: datetime
    scheduled_for: datetime | None
    state: str | None


@dataclass
class Unreadable:
    """A claimed execution whose stored input could not be read: failed at the claim."""

    id: str
    flow_id: str
    trigger: str
    error: str


async def claim(
    session: AsyncSession,
    *,
    worker_id: str,
    limit: int,
    lease_seconds: float,
    cap: int,
    unreadable: list[Unreadable] | None = None,
    held_back: set[str] | None = None,
    finished: Sequence[str] = (),
) -> list[Claimed]:
    """Take up to ``limit`` queued executions, fairly across tenants (see ``_pick_fairly``).

    PostgreSQL: the picked rows are locked with SKIP LOCKED, so concurrent
    claimers take disjoint rows without waiting. SQLite: the caller's write
    transaction (BEGIN IMMEDIATE) makes this the only claimer.

    ``cap`` (0: none; ``Settings.tenant_running_cap``): no queue group (a tenant, or the
    owner of tenantless flows) ever has more than ``cap`` executions running, counted across
    every process (``_within_cap``). The groups whose queued work was passed over at their
    cap are added to ``held_back``: the caller claims again when a slot may have freed.
    ``finished``: the caller's executions whose run has ended and whose outcome is not yet
    recorded (still ``running`` in the database until then, or recorded while this claim
    runs): they hold no slot, so they are left out of the counts, by id, whichever side of
    their record's commit the counts fall on.

    The input comes back as text and is decoded row by row: a row whose input cannot
    be decoded fails alone in this transaction (status ``failed``, a clear error, an
    ``error`` log entry; appended to ``unreadable``) while the others are claimed.
    """
    now = utcnow()
    held: set[str] = set()
    running: dict[str | None, int] = {}
    picked = await _within_cap(
        session,
        await _pick_fairly(
            session,
            limit,
            cap=cap,
            held_back=held,
            running_seen=running,
            finished=finished,
        ),
        cap,
        held,
        running,
        finished,
    )
    if held_back is not None:
        held_back |= held
    if not picked:
        return []
    rows = [
        _ClaimRow(*r)
        for r in await _CLAIM.all(
            session,
            {
                "ids": picked,
                "owner": worker_id,
                "expires": now + timedelta(seconds=lease_seconds),
                "now": now,
            },
        )
    ]
    bad: list[tuple[Any, str]] = []

    def decode(row: Any) -> Claimed:
        return Claimed(
            id=row.id,
            flow_id=row.flow_id,
            flow_version=row.flow_version,
            history_version=row.history_version,
            tenant=row.tenant,
            owner_user=row.owner_user,
            trigger=row.trigger,
            input=None if row.input is None else orjson.loads(row.input),
            attempts=row.attempts,
            created_at=row.created_at,
            scheduled_for=row.scheduled_for,
            state=None if row.state is None else orjson.loads(row.state),
        )

    def on_poison(row: Any, exc: BaseException) -> None:
        bad.append((row, f"its input could not be read: {isolate.reason(exc)}"))

    claimed = [c for _row, c in isolate.each(rows, decode, on_poison)]
    if bad:
        await _fail_unreadable(session, bad, now)
        if unreadable is not None:
            unreadable += [Unreadable(row.id, row.flow_id, row.trigger, error) for row, error in bad]
    order = {eid: i for i, eid in enumerate(picked)}
    return sorted(claimed, key=lambda c: order[c.id])


async def _fail_unreadable(session: AsyncSession, bad: Sequence[tuple[Any, str]], now: datetime) -> None:
    await session.execute(
        execution_status.update(RUNNING, ExecutionStatus.FAILED)  # claimed just now, in this transaction
        .where(_EXECUTIONS.c.id == sa.bindparam("eid"))
        .values(
            error=sa.bindparam("err"),
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        ),
        [{"eid": row.id, "err": error} for row, error in bad],
    )
    await append_logs(session, _failure_entries(bad, now))
    await subflows.wake_parents(
        session, [(row.id, ExecutionStatus.FAILED, None, error) for row, error in bad]
    )


def _failure_entries(failed: Iterable[tuple[Any, str | None]], now: datetime) -> list[dict[str, Any]]:
    """The ``error`` log entry of each execution the queue fails (a row or an Execution with its
    id, flow, tenant and owner, and the error)."""
    return [
        log_entry(
            "error",
            f"execution {row.id} failed: {error}",
            tenant=row.tenant,
            user_id=row.owner_user,
            flow_id=row.flow_id,
            execution_id=row.id,
            timestamp=now,
        )
        for row, error in failed
    ]


async def renew(session: AsyncSession, *, worker_id: str, ids: Sequence[str], lease_seconds: float) -> None:
    if not ids:
        return
    await session.execute(
        sa.update(Execution)
        .where(Execution.id.in_(list(ids)), Execution.status == RUNNING, Execution.lease_owner == worker_id)
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )


def _held_statement(dialect: str) -> sa.Executable:
    held = sa.select(Execution.id).where(
        Execution.id.in_(sa.bindparam("ids", expanding=True)),
        Execution.status == RUNNING,
        Execution.lease_owner == sa.bindparam("owner"),
    )
    return held.with_for_update() if dialect == "postgresql" else held


# Of the given executions, those this worker still holds (PostgreSQL: locked until recorded).
_HELD = Prepared(_held_statement)
# An outcome recorded: each row moves from running to its own final status.
_FINISH = Prepared(
    execution_status.update(RUNNING, sa.bindparam("st"))
    .where(_EXECUTIONS.c.id == sa.bindparam("eid"))
    .values(
        result=sa.bindparam("res"),
        steps=sa.bindparam("stp"),
        error=sa.bindparam("err"),
        finished_at=sa.bindparam("fin"),
        lease_owner=None,
        lease_expires_at=None,
    )
)


async def complete(
    session: AsyncSession,
    outcomes: Sequence[Outcome],
    *,
    worker_id: str,
    count: bool = True,
    max_flow_depth: int = 5,
    started: list[str] | None = None,
    woken: list[str] | None = None,
) -> set[str]:
    """Record finished executions (with their steps), their logs and component counts in one transaction.

    Only executions this worker still holds are recorded: if the lease was lost
    (another worker re-ran it) or the execution was cancelled meanwhile, the
    outcome is dropped so no execution is ever recorded twice. ``count=False``: their
    steps are not counted (the count could not be written: ``isolate.py``).

    Sub-flows (SPEC §12, queue/subflows.py): a parked ``flow`` step's child is enqueued here
    (its id added to ``started``), and a finished child's parent is made due (added to ``woken``).
    A failed execution's error flow (SPEC §11) is enqueued here too (added to ``started``).
    """
    if not outcomes:
        return set()
    ids = [o.execution_id for o in outcomes]
    held = {i for (i,) in await _HELD.all(session, {"ids": ids, "owner": worker_id})}
    parked = [o for o in outcomes if o.execution_id in held and o.status == ExecutionStatus.WAITING]
    mine = [o for o in outcomes if o.execution_id in held and o.status != ExecutionStatus.WAITING]
    table = _EXECUTIONS
    if parked:
        children = await subflows.children_of(session, parked, max_depth=max_flow_depth)
        if children:
            child_ids = await enqueue(session, [NewExecution(**k) for k in children])
            if started is not None:
                started += child_ids
    if parked:
        # Parked (SPEC §11): waiting until resume_at with its continuation; it holds no lease, and
        # its run is not counted against the reaper's attempts (each resume is a new claim).
        await session.execute(
            execution_status.update(RUNNING, ExecutionStatus.WAITING)
            .where(table.c.id == sa.bindparam("eid"))
            .values(
                steps=sa.bindparam("stp"),
                state=sa.bindparam("sta"),
                resume_at=sa.bindparam("due"),
                lease_owner=None,
                lease_expires_at=None,
                attempts=0,
            ),
            [
                {"eid": o.execution_id, "stp": steps.document(o.steps), "sta": o.state, "due": o.resume_at}
                for o in parked
            ],
        )
        park_logs = [entry for o in parked for entry in o.logs]
        if park_logs:
            await append_logs(session, park_logs)
    if not mine:
        return held
    await _FINISH.many(
        session,
        [
            {
                "eid": o.execution_id,
                "st": execution_status.check(RUNNING, o.status),
                "res": o.result,
                "stp": steps.document(o.steps),
                "err": o.error,
                "fin": o.finished_at,
            }
            for o in mine
        ],
    )
    logs = [entry for o in mine for entry in o.logs]
    if logs:
        await append_logs(session, logs)
    # SPEC §11: a failed execution starts its flow's error flow, in this transaction; the
    # caller wakes the engines for it as for a sub-flow's child.
    errors = await start_error_flows(
        session, [o.execution_id for o in mine if o.status == ExecutionStatus.FAILED]
    )
    if started is not None:
        started += errors
    # SPEC §12: a finished sub-flow's parent goes on.
    parents = await subflows.wake_parents(
        session, [(o.execution_id, o.status, o.result, o.error) for o in mine]
    )
    if woken is not None:
        woken += parents
    comp: Counter[tuple[Any, str, str]] = Counter()
    who: dict[str, Outcome] = {}
    for o in mine if count else ():
        who[o.flow_id] = o
        for s in o.steps:
            if s.component_id:
                comp[(o.created_at.date(), s.component_id, o.flow_id)] += s.runs
    await counters.add_component_counts(
        session,
        [
            {
                "day": day,
                "component_id": cid,
                "flow_id": fid,
                "tenant": who[fid].tenant,
                "user_id": who[fid].owner_user,
                "steps": n,
            }
            for (day, cid, fid), n in comp.items()
        ],
    )
    return held


# The resumer's query (SPEC §11): due waiting executions from the partial index
# ix_executions_waiting_due (status = 'waiting' spelled as a literal so both planners match
# the index's predicate). PostgreSQL skips rows another resumer holds; SQLite's write
# transaction is the only writer, and INDEXED BY makes the plan the index or an error.
# The values and cells pass through the columns' own types (ids and times compact on SQLite).
def _waiting_statements(dialect: str) -> tuple[sa.TextualSelect, sa.TextualSelect]:
    """The resumer's two statements for ``dialect``: the due rows, and the next due time."""
    rows = "executions INDEXED BY ix_executions_waiting_due" if dialect == "sqlite" else "executions"
    lock = "" if dialect == "sqlite" else " FOR UPDATE SKIP LOCKED"
    due = (
        sa.text(
            f"SELECT id FROM {rows} WHERE status = 'waiting' AND resume_at <= :now "
            f"ORDER BY resume_at LIMIT :n{lock}"
        )
        .bindparams(sa.bindparam("now", type_=Execution.resume_at.type))
        .columns(sa.column("id", Execution.id.type))
    )
    following = sa.text(f"SELECT min(resume_at) FROM {rows} WHERE status = 'waiting'").columns(
        sa.column("m", Execution.resume_at.type)
    )
    return due, following


_WAITING = {dialect: _waiting_statements(dialect) for dialect in ("postgresql", "sqlite")}


def due_query(session: AsyncSession) -> sa.TextualSelect:
    """The statement ``resume_due`` selects with (bench/waiting.py prints its plan)."""
    return _WAITING[dialect_name(session)][0]


async def resume_due(session: AsyncSession, *, limit: int = 500, now: datetime | None = None) -> list[str]:
    """Move up to ``limit`` waiting executions whose ``resume_at`` has come to ``queued``
    (waiting → queued), oldest due first; returns their ids. Any worker claims them then and
    goes on from their continuation. Each is moved once: the UPDATE is conditional on
    ``waiting``, and PostgreSQL resumers skip each other's rows."""
    now = now or utcnow()
    ids = list((await session.scalars(due_query(session), {"now": now, "n": limit})).all())
    if not ids:
        return []
    moved = await session.execute(
        execution_status.update(ExecutionStatus.WAITING, QUEUED)
        .where(Execution.id.in_(ids))
        .values(resume_at=None)
        .returning(Execution.id)
        .execution_options(synchronize_session=False)
    )
    return list(moved.scalars().all())


async def next_due(session: AsyncSession) -> datetime | None:
    """When the next waiting execution is due (None: none waits); one index probe."""
    stmt = _WAITING[dialect_name(session)][1]
    return cast(datetime | None, await session.scalar(stmt))


async def reap(
    session: AsyncSession, *, max_attempts: int, owners: Sequence[str] | None = None
) -> tuple[int, list[Execution]]:
    """Re-queue executions whose worker died; fail those that keep dying (an ``error`` log entry each).

    A worker is dead when its lease expired or, with ``owners``, when it is one of
    those processes (their heartbeat stopped, ``flowyard.queue.heartbeat``): their
    executions are taken back at once, whatever their lease says. Either way it is
    a re-run, counted against ``max_attempts``.
    """
    if owners is not None and not owners:
        return 0, []
    now = utcnow()
    died = Execution.lease_owner.in_(list(owners)) if owners is not None else Execution.lease_expires_at < now
    requeued = await session.execute(
        execution_status.update(RUNNING, QUEUED)
        .where(died, Execution.attempts < max_attempts)
        .values(lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    dead = list(
        (
            await session.scalars(
                sa.select(Execution).where(
                    Execution.status == RUNNING, died, Execution.attempts >= max_attempts
                )
            )
        ).all()
    )
    for e in dead:
        e.status = execution_status.check(RUNNING, ExecutionStatus.FAILED)  # loaded under this transaction
        e.error = f"abandoned: its worker died {e.attempts} times while running it"
        e.finished_at = now
        e.lease_owner = None
        e.lease_expires_at = None
    await append_logs(session, _failure_entries(((e, e.error) for e in dead), now))
    if dead:  # SPEC §11 (flushed first: start_error_flows reads them as failed)
        await session.flush()
        await start_error_flows(session, [e.id for e in dead])
        await subflows.wake_parents(session, [(e.id, ExecutionStatus.FAILED, None, e.error) for e in dead])
    return int(requeued.rowcount or 0), dead  # type: ignore[attr-defined]


async def release(session: AsyncSession, *, worker_id: str, ids: Sequence[str], started: bool) -> int:
    """Hand executions this worker holds back to the queue at once (it is stopping).

    ``started=False``: they never reached a runner, so the claim is not counted as a run.
    """
    if not ids:
        return 0
    values: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if not started:
        values["attempts"] = Execution.attempts - 1
    result = await session.execute(
        execution_status.update(RUNNING, QUEUED)
        .where(Execution.id.in_(list(ids)), Execution.lease_owner == worker_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def cancel_unfinished(session: AsyncSession, flow_id: str, reason: str) -> list[str]:
    """Cancel whatever of a flow is still queued or running (stop grace period over)."""
    now = utcnow()
    ids = list(
        (
            await session.scalars(
                sa.select(Execution.id).where(Execution.flow_id == flow_id, Execution.status.in_(UNFINISHED))
            )
        ).all()
    )
    if ids:
        await session.execute(
            execution_status.update(UNFINISHED, ExecutionStatus.CANCELLED)
            .where(Execution.id.in_(ids))
            .values(error=reason, finished_at=now, lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        await subflows.wake_parents(session, [(i, ExecutionStatus.CANCELLED, None, reason) for i in ids])
    return ids


async def fail_unfinished(session: AsyncSession, ids: Sequence[str], reason: str) -> list[str]:
    """Fail those of ``ids`` that are still queued or running, with ``reason`` (an execution
    that cannot run, such as one whose input cannot be read); returns the ones failed."""
    if not ids:
        return []
    unfinished = Execution.status.in_(UNFINISHED)
    rows = (
        await session.execute(
            sa.select(Execution.id, Execution.flow_id, Execution.tenant, Execution.owner_user).where(
                Execution.id.in_(list(ids)), unfinished
            )
        )
    ).all()
    found = [row.id for row in rows]
    if found:
        now = utcnow()
        await session.execute(
            execution_status.update(UNFINISHED, ExecutionStatus.FAILED)
            .where(Execution.id.in_(found))
            .values(error=reason, finished_at=now, lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        # The same error entry as every execution the queue fails.
        await append_logs(session, _failure_entries(((row, reason) for row in rows), now))
        await subflows.wake_parents(session, [(i, ExecutionStatus.FAILED, None, reason) for i in found])
    return found


async def unfinished_count(session: AsyncSession, flow_id: str) -> int:
    return int(
        await session.scalar(
            sa.select(sa.func.count())
            .select_from(Execution)
            .where(Execution.flow_id == flow_id, Execution.status.in_(UNFINISHED))
        )
        or 0
    )


async def depth(session: AsyncSession) -> tuple[dict[str, int], float]:
    """Executions queued and running now, and the age in seconds of the oldest queued one
    (0: none), for the metrics. The oldest is one probe of (status, id): ids begin with
    their creation second."""
    counts = {
        status: int(n)
        for status, n in (
            await session.execute(
                sa.select(Execution.status, sa.func.count())
                .where(Execution.status.in_(UNFINISHED))
                .group_by(Execution.status)
            )
        ).all()
    }
    oldest = await session.scalar(sa.select(sa.func.min(Execution.id)).where(Execution.status == QUEUED))
    age = 0.0
    if oldest:
        age = max(0.0, utcnow().timestamp() - int(oldest[:8], 16))
    return counts, age


# -- SPEC §11: cancel by request, and error flows --------------------------------------------


async def cancel(session: AsyncSession, execution_id: str, reason: str) -> ExecutionStatus | None:
    """Cancel one queued, waiting or running execution now (``POST /executions/{id}/cancel``);
    returns the status it left, or None when it had finished (nothing moved).

    A running one is cancelled in the row at once: its worker no longer holds it, so its outcome
    is dropped (``complete``) and the worker interrupts its runner when it next renews its leases
    (``cancelled_among``).
    """
    find = sa.select(Execution.status, Execution.flow_id, Execution.tenant, Execution.owner_user).where(
        Execution.id == execution_id
    )
    if dialect_name(session) == "postgresql":
        # Locked, so its status holds until this commits: a claimer skips it (SKIP LOCKED), a
        # completion waits. SQLite: this write transaction is the only writer.
        find = find.with_for_update()
    row = (await session.execute(find)).first()
    if row is None or row.status not in UNFINISHED:
        return None
    was = ExecutionStatus(row.status)
    now = utcnow()
    moved = await session.execute(
        execution_status.update(was, ExecutionStatus.CANCELLED)
        .where(Execution.id == execution_id)
        .values(error=reason, finished_at=now, lease_owner=None, lease_expires_at=None, resume_at=None)
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return None  # it moved meanwhile (finished, or cancelled by another request)
    await subflows.wake_parents(session, [(execution_id, ExecutionStatus.CANCELLED, None, reason)])
    await append_logs(
        session,
        [
            log_entry(
                "warn",
                f"execution {execution_id} {reason}",
                tenant=row.tenant,
                user_id=row.owner_user,
                flow_id=row.flow_id,
                execution_id=execution_id,
                timestamp=now,
            )
        ],
    )
    return was


async def cancelled_among(session: AsyncSession, ids: Sequence[str]) -> list[str]:
    """Those of ``ids`` (executions a worker runs) that were cancelled meanwhile."""
    if not ids:
        return []
    return list(
        (
            await session.scalars(
                sa.select(Execution.id).where(
                    Execution.id.in_(list(ids)), Execution.status == ExecutionStatus.CANCELLED
                )
            )
        ).all()
    )


ERROR_TRIGGER = "error"  # the trigger (and metadata.source) of an error flow's execution


def _loads(text: str | None) -> Any:
    """Stored JSON read as text (as ``claim`` does): a value that cannot be read is None."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _owner_list(value: Any) -> list[dict[str, str]]:
    """A flow's owners as stored, keeping only well-formed entries."""
    if not isinstance(value, list):
        return []
    return [o for o in value if isinstance(o, dict) and isinstance(o.get("id"), str)]


async def start_error_flows(session: AsyncSession, failed_ids: Sequence[str]) -> list[str]:
    """Queue one execution of its flow's error flow (``errorFlowId``) for each of ``failed_ids``
    that ended failed (SPEC §11), in the caller's transaction; returns the new ids.

    The error flow runs with trigger ``error`` and ``data = {"execution": {id, flowId, error,
    step}, "input": <the trigger data>}``, its ``parentExecutionId`` the failed execution, and
    is counted for the error flow. An error flow's own failures start nothing (no loops). An
    error flow that is not active, or no longer shares an owner with the failed flow, is not
    started: a ``warn`` entry in the failed execution's logs says so.
    """
    if not failed_ids:
        return []
    failed = (
        await session.execute(
            sa.select(
                Execution.id,
                Execution.flow_id,
                Execution.tenant,
                Execution.owner_user,
                Execution.error,
                sa.cast(Execution.input, sa.Text).label("input"),
                packed.raw_cell(Execution.steps, sqlite=dialect_name(session) == "sqlite").label("steps"),
                Flow.error_flow_id,
                sa.cast(Flow.owners, sa.Text).label("owners"),
            )
            .join(Flow, Flow.id == Execution.flow_id)
            .where(
                Execution.id.in_(list(failed_ids)),
                Execution.status == ExecutionStatus.FAILED,
                Execution.trigger != ERROR_TRIGGER,
                Flow.error_flow_id.is_not(None),
            )
        )
    ).all()
    if not failed:
        return []
    # Columns, the owners as text decoded here: a flow row that cannot be read makes its error
    # flow "not shared" rather than failing the transaction that records the failure.
    targets = {
        f.id: f
        for f in (
            await session.execute(
                sa.select(
                    Flow.id,
                    Flow.version,
                    Flow.name,
                    Flow.tenant,
                    Flow.status,
                    sa.cast(Flow.owners, sa.Text).label("owners"),
                ).where(Flow.id.in_({row.error_flow_id for row in failed}))
            )
        ).all()
    }
    now = utcnow()
    items: list[NewExecution] = []
    skipped: list[dict[str, Any]] = []
    for row in failed:
        target = targets.get(row.error_flow_id)
        owners = _owner_list(_loads(row.owners))
        target_owners = _owner_list(_loads(target.owners)) if target is not None else []
        why = None
        if target is None:
            why = "no longer exists"
        elif target.status != FlowStatus.ACTIVE:
            why = f"is not active (status {target.status})"
        elif not shares_owner(owners, target_owners):
            why = "shares no owner with this flow"
        if why is not None or target is None:
            skipped.append(
                log_entry(
                    "warn",
                    f"error flow {row.error_flow_id} not started: it {why}",
                    tenant=row.tenant,
                    user_id=row.owner_user,
                    flow_id=row.flow_id,
                    execution_id=row.id,
                    timestamp=now,
                )
            )
            continue
        step_docs = packed.unpack_or_none(row.steps)
        failed_step = next(
            (
                s.get("nodeId")
                for s in (step_docs if isinstance(step_docs, list) else [])
                if isinstance(s, dict) and s.get("status") == "failed"
            ),
            None,
        )
        items.append(
            NewExecution(
                id=new_id(),
                flow_id=target.id,
                flow_version=target.version,
                flow_name=target.name,
                tenant=target.tenant,
                owner_user=owner_user_of(target_owners),
                trigger=ERROR_TRIGGER,
                input={
                    "execution": {
                        "id": row.id,
                        "flowId": row.flow_id,
                        "error": row.error,
                        "step": failed_step,
                    },
                    "input": _loads(row.input),
                },
                created_at=now,
                parent_execution_id=row.id,
            )
        )
    if skipped:
        await append_logs(session, skipped)
    return await enqueue(session, items)
