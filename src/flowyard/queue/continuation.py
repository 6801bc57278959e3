"""The continuation of an execution: where it goes on from when it does not start at its
trigger (``executions.state``). Plain JSON, read by the queue and by runner processes (this
module imports nothing of the database layer).

Two writers make one:
- the runner, when an execution parks (SPEC §11: a retry wait, a long ``delay``, a ``join`` or
  a sub-flow it waits for): its pending messages, the results of the steps it ran so far and
  its own bookkeeping, to go on exactly where it stopped when it is resumed;
- a replay (``POST /executions/{id}/retry``): :func:`start_at` the failed step, with that
  step's stored input and the results of the steps before it carried over, not run again.

Shape (version 1)::

    {"v": 1,
     "pending": [{"node": <node id>, "message": {"data": ..., "metadata": {...}},
                  "attempt": <attempts already made at this node for this message, 0>}, ...],
     "steps": [<a step record in the served shape (queue/steps.py)>, ...],   # carried over
     ...}                                                                     # runner-private keys

The runner may add keys of its own (documented where it writes them); readers ignore keys they
do not know, so a continuation written by one version is read by the next. A parked execution's
continuation (``runtime/runner.py``) adds, per pending entry, ``index`` (the message's arrival
number at its node: its idempotency key) and ``resumed`` (the execution parked for that node on
that message: a long ``delay`` passes it on); and at the top ``enqueued`` (arrivals per node so
far), ``emitted`` (messages so far, for FLOWYARD_MAX_MESSAGES), ``lastSink`` and ``reply`` (the
result so far). An entry without ``index`` (a replay's) is a new arrival at its node.
SPEC §12 adds: ``joins`` at the top (per join node, the messages it holds: ``{"arrivals":
[[<incoming edge position>, <message>], ...], "since": <when the open set began>}``); per pending
entry, ``edge`` (a message on its way to a join: the position of the edge it came by) and
``call`` (a parked ``flow`` step: ``{"flowId", "timeout"}``), to which the queue adds ``childId``
when it starts the child and ``child`` (its outcome, or ``{"error"}`` when it could not start).
"""

from __future__ import annotations

from typing import Any

VERSION = 1


def start_at(node_id: str, message: dict[str, Any], carried_steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A continuation that runs ``node_id`` on ``message`` first, with ``carried_steps`` (served
    shape) kept as the results of the steps that ran before it."""
    return {
        "v": VERSION,
        "pending": [{"node": node_id, "message": message, "attempt": 0}],
        "steps": list(carried_steps),
    }


def pending_of(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The messages still to deliver, in order (empty for no continuation)."""
    if not state:
        return []
    return list(state.get("pending") or [])


def carried_of(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The step records carried over from before (served shape)."""
    if not state:
        return []
    return list(state.get("steps") or [])
