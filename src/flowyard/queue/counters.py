"""The writes behind the counts (SPEC §8): per-day counters and their weekly and monthly
rollups, added together by the caller's transaction (the engine's queue when it accepts
executions and when it records their steps). The only writer of these four tables.

A component's period rows also record on which of the period's days it ran in the flow
(``days``, one bit per day), so that the flows a component ran in over a frame are read from
the months the frame touches alone (executions/service.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.db.dialect import increment
from flowyard.queue.models import ComponentDayCount, ComponentPeriodCount, FlowDayCount, FlowPeriodCount
from flowyard.queue.periods import rollups_of

FLOW_KEYS = ("flow_id",)
FLOW_ATTRIBUTES = ("tenant", "user_id", "flow_name")
COMPONENT_KEYS = ("component_id", "flow_id")
COMPONENT_ATTRIBUTES = ("tenant", "user_id")


def _rollup(
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    counter: str,
    attributes: Sequence[str],
    days: str | None = None,
) -> list[dict[str, Any]]:
    """Daily rows summed into their week and month rows (the last row's attributes win);
    with ``days``, that column of a period row gets bit ``i`` for its ``i``-th day (from 0)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        for period, start in rollups_of(row["day"]):
            key = (period, start, *(row[k] for k in keys))
            rec = out.get(key)
            if rec is None:
                rec = out[key] = {"period": period, "start": start, **{k: row[k] for k in keys}, counter: 0}
                if days:
                    rec[days] = 0
            rec[counter] += row[counter]
            rec.update((a, row[a]) for a in attributes)
            if days:
                rec[days] |= 1 << (row["day"] - start).days
    return list(out.values())


async def add_flow_counts(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Add executions: rows of (day, flow_id, tenant, user_id, flow_name, executions)."""
    await increment(session, FlowDayCount, ("day", *FLOW_KEYS), "executions", rows, replace=FLOW_ATTRIBUTES)
    await increment(
        session,
        FlowPeriodCount,
        ("period", "start", *FLOW_KEYS),
        "executions",
        _rollup(rows, FLOW_KEYS, "executions", FLOW_ATTRIBUTES),
        replace=FLOW_ATTRIBUTES,
    )


async def add_component_counts(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Add steps run: rows of (day, component_id, flow_id, tenant, user_id, steps)."""
    await increment(session, ComponentDayCount, ("day", *COMPONENT_KEYS), "steps", rows)
    await increment(
        session,
        ComponentPeriodCount,
        ("period", "start", *COMPONENT_KEYS),
        "steps",
        _rollup(rows, COMPONENT_KEYS, "steps", COMPONENT_ATTRIBUTES, days="days"),
        bits=("days",),
    )
