"""Completion notices for synchronous webhooks (``?wait=``) waiting in this process.

Fed by the worker of this process directly and by the cross-process notification
channel (``flowyard.queue.notify``) for executions finished elsewhere. A notice
carries the execution's status, result and error when they travelled with it, so
the waiter answers without reading the database; ``None`` means "finished, read it".
A short memory of recent notices covers a waiter that registers just after its
execution finished.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

Result = tuple[str, Any, Any]  # status, result, error
_RECENT = 1024


class CompletionHub:
    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[Result | None]]] = {}
        self._recent: OrderedDict[str, Result | None] = OrderedDict()

    def register(self, execution_id: str) -> asyncio.Future[Result | None]:
        fut: asyncio.Future[Result | None] = asyncio.get_running_loop().create_future()
        if execution_id in self._recent:
            fut.set_result(self._recent[execution_id])
            return fut
        self._waiters.setdefault(execution_id, []).append(fut)
        return fut

    def discard(self, execution_id: str, fut: asyncio.Future[Result | None]) -> None:
        waiters = self._waiters.get(execution_id)
        if waiters and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                del self._waiters[execution_id]

    def forget(self, execution_id: str) -> None:
        """A notice turned out early (the row is not final): wait for the next one."""
        self._recent.pop(execution_id, None)

    def notify(self, execution_ids: Iterable[str]) -> None:
        """These executions finished; waiters read the outcome themselves."""
        self.finish((eid, None) for eid in execution_ids)

    def finish(self, items: Iterable[tuple[str, Result | None]], *, remember: bool = True) -> None:
        """Complete the waiters of these executions. ``remember=False``: the outcomes may be
        large, so a late waiter is only told "finished" (and reads the row)."""
        recent = self._recent
        for eid, result in items:
            recent[eid] = result if remember else None
            for fut in self._waiters.pop(eid, ()):
                if not fut.done():
                    fut.set_result(result)
        while len(recent) > _RECENT:
            recent.popitem(last=False)
