"""In-process completion notices, so a synchronous webhook (``?wait=``) answers
as soon as a worker of the same process records the execution. Executions
finished by other processes are seen by polling the database."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class CompletionHub:
    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def register(self, execution_id: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(execution_id, []).append(fut)
        return fut

    def discard(self, execution_id: str, fut: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(execution_id)
        if waiters and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                del self._waiters[execution_id]

    def notify(self, execution_ids: Iterable[str]) -> None:
        if not self._waiters:
            return
        for eid in execution_ids:
            for fut in self._waiters.pop(eid, ()):
                if not fut.done():
                    fut.set_result(None)
