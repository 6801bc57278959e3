"""The sets a ``join`` node gathers (SPEC §12), per node of one execution.

A join waits for one message from each of its incoming edges (or, with ``fields.count``, for
that many messages from any of them), then emits one message whose data is the list of their
data in edge order (arrival order within one edge). A set opens with its first message;
``fields.timeout`` seconds later an incomplete set fails the step. The sets are plain JSON in the
execution's continuation (``joins``, queue/continuation.py), so a parked execution holds them
durably and goes on with them on any worker. Pure: no database, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flowyard.clock import isoformat

Message = dict[str, Any]


@dataclass
class JoinSet:
    """The messages a join holds: ``arrivals`` as (incoming edge position, message), in arrival
    order; ``since``: when the open set began (None: nothing is held)."""

    edges: int  # how many incoming edges the node has
    count: int | None
    timeout: float
    arrivals: list[tuple[int, Message]] = field(default_factory=list)
    since: datetime | None = None

    @property
    def deadline(self) -> datetime | None:
        return None if self.since is None else self.since + timedelta(seconds=self.timeout)

    def arrive(self, slot: int, message: Message, now: datetime) -> Message | None:
        """Hold ``message`` (from incoming edge ``slot``); the set's message when it completes."""
        self.arrivals.append((slot, message))
        if self.since is None:
            self.since = now
        taken = self._complete()
        if taken is None:
            return None
        self.since = now if self.arrivals else None  # what is left over opens the next set
        taken.sort(key=lambda a: a[0])  # edge order; stable: arrival order within one edge
        return {"data": [m["data"] for _slot, m in taken], "metadata": taken[-1][1]["metadata"]}

    def _complete(self) -> list[tuple[int, Message]] | None:
        if self.count is not None:
            if len(self.arrivals) < self.count:
                return None
            taken, self.arrivals = self.arrivals[: self.count], self.arrivals[self.count :]
            return taken
        first: dict[int, int] = {}
        for i, (slot, _m) in enumerate(self.arrivals):
            first.setdefault(slot, i)
        if len(first) < self.edges:
            return None
        picked = set(first.values())
        taken = [a for i, a in enumerate(self.arrivals) if i in picked]
        self.arrivals = [a for i, a in enumerate(self.arrivals) if i not in picked]
        return taken

    def expire(self) -> tuple[str, Message]:
        """Give up the open set (its time is over): why, and the partial set as a message (the
        failed step's input), in edge order. Nothing is held afterwards."""
        held = sorted(self.arrivals, key=lambda a: a[0])
        if self.count is not None:
            why = f"{len(held)} of {self.count} messages arrived"
        else:
            missing = sorted(set(range(self.edges)) - {slot for slot, _m in held})
            why = "no message came from incoming edge(s) " + ", ".join(str(s + 1) for s in missing)
        self.arrivals, self.since = [], None
        metadata = held[-1][1]["metadata"] if held else {}
        return (
            f"join timed out after {self.timeout:g} s: {why}",
            {"data": [m["data"] for _slot, m in held], "metadata": metadata},
        )

    def document(self) -> dict[str, Any]:
        return {
            "arrivals": [[slot, m] for slot, m in self.arrivals],
            "since": isoformat(self.since) if self.since is not None else None,
        }

    def restore(self, doc: Any) -> None:
        """Take the held messages back from a continuation's ``joins`` entry."""
        if not isinstance(doc, dict):
            return
        self.arrivals = [
            (int(a[0]), a[1]) for a in doc.get("arrivals") or [] if isinstance(a, list) and len(a) == 2
        ]
        since = doc.get("since")
        self.since = datetime.fromisoformat(since) if isinstance(since, str) and self.arrivals else None
