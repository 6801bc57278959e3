"""An execution's status: its states and the moves allowed between them, and :func:`update`,
the start of every statement that moves it. The queue (``queue/store.py``) is the only
writer of execution rows and builds each of its moves from :func:`update`; the rest of the
code only reads the status, comparing with :class:`ExecutionStatus`.

    (accepted) -> queued --claim--> running --outcome--> succeeded | failed | cancelled
                    ^  ^               |  |
                    |  +--reap/release-+  +--park--> waiting (resume_at; holds nothing)
                    +------------resume (due)-------------+
                                 queued | waiting | running --cancel / stop grace over--> cancelled
                                 queued | waiting | running --input unreadable--> failed

Each move is one conditional ``UPDATE executions SET status = <to> WHERE status = <from>``:
a row that another process moved meanwhile is left alone (its UPDATE matches nothing).

Imports: the execution model, ``flowyard.states`` and SQLAlchemy only.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, cast

import sqlalchemy as sa

from flowyard.queue.models import Execution
from flowyard.states import IllegalMove, Machine

__all__ = [
    "EXECUTION_STATUSES",
    "FINISHED",
    "MOVES",
    "UNFINISHED",
    "ExecutionStatus",
    "IllegalMove",
    "check",
    "update",
]


class ExecutionStatus(StrEnum):
    """The stored values stay these strings (``executions.status``, the API's ``status``)."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


EXECUTION_STATUSES = tuple(ExecutionStatus)
# Unfinished: may still run. A waiting execution holds no runner, slot or lease (SPEC §11).
UNFINISHED = (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.WAITING)
FINISHED = (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)

# Every allowed move and who makes it (all in queue/store.py); any other pair is refused.
# A new execution is inserted ``queued`` (``queue.enqueue``); finished ones never move again.
MOVES: dict[tuple[ExecutionStatus, ExecutionStatus], str] = {
    (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING): "claim: a worker takes it with a lease",
    (ExecutionStatus.RUNNING, ExecutionStatus.QUEUED): "reap (its worker died) or release (it stops)",
    (ExecutionStatus.RUNNING, ExecutionStatus.SUCCEEDED): "complete: the outcome",
    (ExecutionStatus.RUNNING, ExecutionStatus.FAILED): "complete; reap: died too often; claim: bad input",
    (ExecutionStatus.RUNNING, ExecutionStatus.CANCELLED): "complete: flow gone; stop grace over; cancel",
    (ExecutionStatus.QUEUED, ExecutionStatus.CANCELLED): "cancel_unfinished: the stop grace is over; cancel",
    (ExecutionStatus.RUNNING, ExecutionStatus.WAITING): "complete: it parks until resume_at (SPEC §11)",
    (ExecutionStatus.WAITING, ExecutionStatus.QUEUED): "resume: it is due (or what it waits for came)",
    (ExecutionStatus.WAITING, ExecutionStatus.CANCELLED): "cancel_unfinished: the stop grace is over; cancel",
    (ExecutionStatus.WAITING, ExecutionStatus.FAILED): "fail_unfinished (quarantine); resume: cannot go on",
    (
        ExecutionStatus.QUEUED,
        ExecutionStatus.FAILED,
    ): "fail_unfinished: its input is unreadable (quarantine)",
}

_EXECUTIONS = cast(sa.Table, Execution.__table__)


# check(frm, to): ``to`` if the move is allowed, else IllegalMove.
check = Machine(ExecutionStatus, MOVES).check


def update(
    frm: ExecutionStatus | Iterable[ExecutionStatus], to: ExecutionStatus | sa.BindParameter[str]
) -> sa.Update:
    """``UPDATE executions SET status = <to> WHERE status = <frm>`` (``frm`` may be several
    states: ``IN``), for the caller to narrow with ``.where`` and add ``.values``. Refuses a move
    outside :data:`MOVES` with :class:`IllegalMove`. ``to`` may be a bound parameter for an
    executemany whose rows move to different states: each row's value then goes through
    :func:`check` where it is bound."""
    sources = [ExecutionStatus(frm)] if isinstance(frm, str) else [ExecutionStatus(f) for f in frm]
    group: sa.ColumnElement[Any] | None
    if isinstance(to, sa.BindParameter):
        # Each row's own status decides (constants, not an IN list: an executemany binds no list).
        finishing = [(to == sa.literal_column(f"'{s}'"), sa.null()) for s in FINISHED]
        group = sa.case(*finishing, else_=_EXECUTIONS.c.queue_group)
    else:
        for source in sources:
            check(source, to)
        group = sa.null() if to in FINISHED else None
    where = _EXECUTIONS.c.status == sources[0] if len(sources) == 1 else _EXECUTIONS.c.status.in_(sources)
    stmt = sa.update(_EXECUTIONS).where(where).values(status=to)
    # A finished execution leaves the queue: its fair-share group (read for queued and running
    # rows only) is not kept in the history.
    return stmt if group is None else stmt.values(queue_group=group)
