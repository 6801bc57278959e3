"""Incoming webhooks with group commit.

A webhook is acknowledged only after its execution row is committed. Doing
one commit (an fsync with SQLite's synchronous=FULL) per request would cap
throughput at the disk's fsync rate, so concurrent requests are gathered for
a moment and committed together in one transaction: every request still waits
for its own durable commit, but they share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.engine import queue
from flowyard.errors import Conflict, FlowyardError, NotFound, StorageUnavailable, Unauthorized
from flowyard.executions.models import IDEMPOTENCY_WINDOW, IdempotencyKey
from flowyard.flows.models import Flow
from flowyard.ids import is_valid_id, new_id

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "x-flowyard-signature"
_MAX_BATCH = 512


@dataclass
class Accepted:
    execution_id: str
    flow_id: str
    replayed: bool = False


@dataclass
class WebhookRequest:
    flow_id: str
    payload: Any
    body_hash: str
    raw: bytes
    idempotency_key: str | None
    signature: str | None
    future: asyncio.Future[Accepted] | None = field(repr=False, default=None)


def not_found(flow_id: str) -> NotFound:
    return NotFound(f"Flow {flow_id} either does not exist or is inactive.")


def _signature_ok(secret: str, raw: bytes, header: str | None) -> bool:
    if not header:
        return False
    expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header.strip().lower())


class WebhookBatcher:
    def __init__(
        self, db: Database, *, window_ms: float, on_commit: Callable[[], None] | None = None
    ) -> None:
        self.db = db
        self.window = window_ms / 1000
        self.on_commit = on_commit
        self._pending: list[WebhookRequest] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def submit(self, request: WebhookRequest) -> Accepted:
        if not is_valid_id(request.flow_id):
            raise not_found(request.flow_id[:64])
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="flowyard-webhook-batcher")
        future: asyncio.Future[Accepted] = asyncio.get_running_loop().create_future()
        request.future = future
        self._pending.append(request)
        self._wake.set()
        return await future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for req in self._pending:
            if req.future is not None and not req.future.done():
                req.future.set_exception(StorageUnavailable("The service is shutting down."))

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.window and len(self._pending) < _MAX_BATCH:
                await asyncio.sleep(self.window)  # let concurrent requests join this commit
            while self._pending:
                batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
                await self._commit(batch)

    async def _commit(self, batch: list[WebhookRequest]) -> None:
        outcomes: dict[int, Accepted | FlowyardError] = {}
        try:
            async with self.db.write() as session:
                outcomes = await accept_batch(session, batch)
        except Exception as exc:
            if len(batch) > 1:
                # One poisoned request must not fail its neighbours: retry them one by one.
                for req in batch:
                    await self._commit([req])
                return
            log.exception("storing a webhook failed")
            error = exc if isinstance(exc, FlowyardError) else StorageUnavailable()
            outcomes = {0: error}
        accepted = False
        for i, req in enumerate(batch):
            result = outcomes.get(i)
            if req.future is None or req.future.done():
                continue
            if isinstance(result, Accepted):
                accepted = accepted or not result.replayed
                req.future.set_result(result)
            else:
                req.future.set_exception(result or StorageUnavailable())
        if accepted and self.on_commit is not None:
            self.on_commit()


async def accept_batch(
    session: AsyncSession, batch: list[WebhookRequest]
) -> dict[int, Accepted | FlowyardError]:
    """Validate and store a batch of webhooks in the caller's transaction."""
    flow_ids = sorted({r.flow_id for r in batch})
    flows = {
        f.id: f
        for f in (
            await session.execute(
                sa.select(
                    Flow.id,
                    Flow.status,
                    Flow.cron,
                    Flow.webhook_secret,
                    Flow.tenant,
                    Flow.owners,
                    Flow.version,
                    Flow.name,
                ).where(Flow.id.in_(flow_ids))
            )
        ).all()
    }
    now = utcnow()
    out: dict[int, Accepted | FlowyardError] = {}
    new: list[queue.NewExecution] = []
    keys_seen: dict[tuple[str, str], tuple[str, str]] = {}
    for i, req in enumerate(batch):
        flow = flows.get(req.flow_id)
        if flow is None or flow.status != "active":
            out[i] = not_found(req.flow_id)
            continue
        if flow.cron:
            out[i] = Conflict(f"Flow {req.flow_id} runs on a schedule and takes no webhooks.")
            continue
        if flow.webhook_secret and not _signature_ok(flow.webhook_secret, req.raw, req.signature):
            out[i] = Unauthorized("Missing or wrong X-Flowyard-Signature (sha256=<HMAC-SHA256 of the body>).")
            continue
        if req.idempotency_key is not None:
            key = (req.flow_id, req.idempotency_key)
            earlier = keys_seen.get(key)
            if earlier is None:
                row = await session.get(IdempotencyKey, key)
                if row is not None and now - row.created_at < IDEMPOTENCY_WINDOW:
                    earlier = (row.request_hash, row.execution_id)
            if earlier is not None:
                if earlier[0] != req.body_hash:
                    out[i] = Conflict("Idempotency-Key was already used with a different body.")
                else:
                    out[i] = Accepted(earlier[1], req.flow_id, replayed=True)
                continue
        eid = new_id()
        new.append(
            queue.NewExecution(
                id=eid,
                flow_id=req.flow_id,
                flow_version=flow.version,
                flow_name=flow.name,
                tenant=flow.tenant,
                owner_user=queue.owner_user_of(flow.owners),
                trigger="webhook",
                input=req.payload,
                created_at=now,
            )
        )
        if req.idempotency_key is not None:
            keys_seen[(req.flow_id, req.idempotency_key)] = (req.body_hash, eid)
        out[i] = Accepted(eid, req.flow_id)
    await queue.enqueue(session, new)
    for (flow_id, idem_key), (body_hash, eid) in keys_seen.items():
        # An expired key is replaced: the window is 24 h, not forever.
        await session.execute(
            sa.delete(IdempotencyKey).where(IdempotencyKey.flow_id == flow_id, IdempotencyKey.key == idem_key)
        )
        session.add(
            IdempotencyKey(
                flow_id=flow_id, key=idem_key, request_hash=body_hash, execution_id=eid, created_at=now
            )
        )
    await session.flush()
    return out
