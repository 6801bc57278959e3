"""Acceptance: triggered work becomes durable execution rows, with group commit.

One way in for every trigger that brings a payload: a webhook (``webhooks/``) and a broker
event (``triggers/consumers.py``, ``trigger`` = its component, no signature) are accepted by
``accept_batch``, gathered by ``WebhookBatcher``; the flow must be active, the webhook's
signature checked (the check is ``webhooks/signature.py``'s, passed in at start-up as
``WebhookLimits.verify``), the rate bucket and the idempotency key honoured, and then
``store.enqueue`` inserts the rows. (A cron tick is claimed by the scheduler's compare-and-set
and goes straight to ``store.enqueue``: it has no body, key, signature or rate.)

A request is acknowledged only after its execution row is committed. Doing
one commit (an fsync with SQLite's synchronous=FULL) per request would cap
throughput at the disk's fsync rate, so concurrent requests are gathered for
a moment and committed together in one transaction: every request still waits
for its own durable commit, but they share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import isolate, metrics
from flowyard.clock import utcnow
from flowyard.db.dialect import insert_ignore_for
from flowyard.db.prepared import Prepared
from flowyard.db.session import Database
from flowyard.errors import (
    Conflict,
    FlowyardError,
    InvalidInput,
    NotFound,
    StorageUnavailable,
    TooManyRequests,
    Unauthorized,
)
from flowyard.flows.models import Flow
from flowyard.flows.status import FlowStatus
from flowyard.ids import is_valid_id, new_id
from flowyard.queue import store as queue
from flowyard.queue.models import IDEMPOTENCY_WINDOW, IdempotencyKey
from flowyard.queue.notify import WORK, Notifier
from flowyard.queue.rate_buckets import WebhookRateBucket

if TYPE_CHECKING:
    from flowyard.config import Settings
    from flowyard.secrets.crypto import SecretBox

log = logging.getLogger(__name__)

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
    # "webhook", or the component of an event trigger (triggers/consumers.py): no signature then.
    trigger: str = "webhook"


def not_found(flow_id: str) -> NotFound:
    return NotFound(f"Flow {flow_id} either does not exist or is inactive.")


# Why a webhook's signature does not authenticate its body, as the refusal to answer, or None
# when it does: (flow's secret, raw body, signature header, now, tolerance). The HTTP door's
# (``webhooks/signature.py``), passed in at start-up.
SignatureCheck = Callable[[str, bytes, "str | None", float, float], "FlowyardError | None"]


@dataclass(frozen=True)
class WebhookLimits:
    """The settings the acceptance of a webhook depends on, its signature check and the key
    that opens the flows' webhook secrets (stored sealed, like credentials:
    ``flows.service`` takes the seal from its router). Without a check, or a secret this key cannot open,
    a webhook to a flow with a secret is refused (nothing may pass unchecked)."""

    signature_tolerance: float = 300.0
    rate: float = 0.0  # requests per second per flow; 0: no limit
    burst: int = 1
    verify: SignatureCheck | None = None
    box: SecretBox | None = None
    _opened: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_settings(
        cls, settings: Settings, box: SecretBox | None = None, verify: SignatureCheck | None = None
    ) -> WebhookLimits:
        return cls(
            signature_tolerance=settings.webhook_signature_tolerance_seconds,
            rate=settings.webhook_rate_limit,
            burst=settings.webhook_burst(),
            verify=verify,
            box=box,
        )

    def webhook_secret(self, sealed: str) -> str | None:
        """The secret a flow's stored (sealed) ``webhook_secret`` holds; None when it cannot be
        opened (no key here, or another key), which refuses every signature. Opened secrets are
        kept per sealed text (a changed secret is a new text)."""
        secret = self._opened.get(sealed)
        if secret is None and self.box is not None:
            try:
                opened = self.box.open(sealed)
            except ValueError:
                return None
            if not isinstance(opened, str):
                return None
            if len(self._opened) >= 4096:
                self._opened.clear()
            secret = self._opened[sealed] = opened
        return secret


_BUCKET_TABLE = cast(sa.Table, WebhookRateBucket.__table__)
# A bucket, full, for each flow that has none yet.
_NEW_BUCKETS = Prepared(
    lambda dialect: insert_ignore_for(dialect, _BUCKET_TABLE, ["flow_id"]),
    columns=("flow_id", "tokens", "refilled_at"),
)


def _buckets_statement(dialect: str) -> sa.Executable:
    query = (
        sa.select(_BUCKET_TABLE.c.flow_id, _BUCKET_TABLE.c.tokens, _BUCKET_TABLE.c.refilled_at)
        .where(_BUCKET_TABLE.c.flow_id.in_(sa.bindparam("flows", expanding=True)))
        .order_by(_BUCKET_TABLE.c.flow_id)
    )
    return query.with_for_update() if dialect == "postgresql" else query


# The flows' buckets, locked in flow order on PostgreSQL.
_BUCKETS = Prepared(_buckets_statement)
_REFILLED = Prepared(
    sa.update(_BUCKET_TABLE)
    .where(_BUCKET_TABLE.c.flow_id == sa.bindparam("fid"))
    .values(tokens=sa.bindparam("tok"), refilled_at=sa.bindparam("at"))
)


async def take_tokens(
    session: AsyncSession, wanted: dict[str, int], *, rate: float, burst: int, now: float
) -> dict[str, tuple[int, int]]:
    """Take up to ``wanted[flow]`` tokens from each flow's bucket, in the caller's transaction.

    Returns, per flow, the tokens granted and the seconds until the next one. The
    bucket rows are locked (PostgreSQL: FOR UPDATE, in flow order; SQLite: the
    single writer), so API processes sharing the database share the budget.
    """
    flows = sorted(wanted)
    await _NEW_BUCKETS.many(
        session, [{"flow_id": f, "tokens": float(burst), "refilled_at": now} for f in flows]
    )
    out: dict[str, tuple[int, int]] = {}
    updates = []
    for flow_id, tokens, refilled_at in await _BUCKETS.all(session, {"flows": flows}):
        tokens = min(float(burst), tokens + max(0.0, now - refilled_at) * rate)
        granted = min(wanted[flow_id], int(tokens))
        tokens -= granted
        out[flow_id] = (granted, max(1, math.ceil((1.0 - tokens) / rate)) if tokens < 1 else 1)
        updates.append({"fid": flow_id, "tok": tokens, "at": max(now, refilled_at)})
    await _REFILLED.many(session, updates)
    return out


class WebhookBatcher:
    def __init__(
        self,
        db: Database,
        *,
        window_ms: float,
        on_commit: Callable[[], None] | None = None,
        limits: WebhookLimits | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.db = db
        self.notifier = notifier or Notifier()
        self.limits = limits or WebhookLimits()
        self.window = window_ms / 1000
        self.on_commit = on_commit
        self._pending: list[WebhookRequest] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def submit(self, request: WebhookRequest) -> Accepted:
        if not is_valid_id(request.flow_id):
            raise not_found(request.flow_id[:64])
        if self._task is None or self._task.done():
            # A fresh context: not the request id of the request that happened to start it.
            self._task = asyncio.create_task(
                self._run(), name="flowyard-webhook-batcher", context=contextvars.Context()
            )
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
        """One transaction for the batch; a request that breaks it is answered alone
        (``isolate.py``) and its neighbours are stored all the same."""

        async def store(part: Sequence[WebhookRequest], *, count: bool = True) -> None:
            async def transaction(session: AsyncSession) -> dict[int, Accepted | FlowyardError]:
                outcomes = await accept_batch(session, part, self.limits, count=count)
                fresh = any(isinstance(o, Accepted) and not o.replayed for o in outcomes.values())
                if fresh:  # wakes the engines, whichever process they run in, once this commits
                    await self.notifier.stage(session, [WORK])
                return outcomes

            self._answer(part, await self.db.transact(transaction))

        async def on_poison(req: WebhookRequest, exc: BaseException) -> None:
            why = isolate.reason(exc)
            # Once more as it is (a race with another process settles now: a concurrent
            # idempotency key is found), then, in case only its count broke
            # (queue/counters.py), uncounted.
            counted = await isolate.write_alone(lambda count: store([req], count=count))
            if counted is False:
                log.error("flow %s: a request was stored without counting it: %s", req.flow_id, why)
                metrics.poison("count")
            if counted is not None:
                return
            log.error("flow %s: a request could not be stored and is refused: %s", req.flow_id, why)
            metrics.poison("webhook")
            # Not a 503: storing it again would fail again (the reason is logged, not told).
            self._answer([req], {0: InvalidInput("This request could not be stored.")})

        left = await isolate.bisect(batch, store, on_poison)
        if left.items:
            log.error(
                "storing %d webhooks failed: %s",
                len(left.items),
                isolate.reason(left.error) if left.error else "?",
            )
            error = left.error if isinstance(left.error, StorageUnavailable) else StorageUnavailable()
            for req in left.items:
                if req.future is not None and not req.future.done():
                    req.future.set_exception(error)

    def _answer(self, batch: Sequence[WebhookRequest], outcomes: dict[int, Accepted | FlowyardError]) -> None:
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
        if accepted:
            self.notifier.committed([WORK])
            if self.on_commit is not None:
                self.on_commit()


# What accepting a webhook reads of its flow.
_FLOWS = Prepared(
    sa.select(
        Flow.id,
        Flow.status,
        Flow.cron,
        Flow.webhook_secret,
        Flow.tenant,
        Flow.owners,
        Flow.version,
        Flow.history_version,
        Flow.name,
    ).where(Flow.id.in_(sa.bindparam("ids", expanding=True)))
)


class _FlowRow(NamedTuple):
    id: str
    status: str
    cron: str | None
    webhook_secret: str | None
    tenant: str | None
    owners: Any
    version: int
    history_version: int
    name: str


async def accept_batch(
    session: AsyncSession,
    batch: Sequence[WebhookRequest],
    limits: WebhookLimits | None = None,
    *,
    count: bool = True,
) -> dict[int, Accepted | FlowyardError]:
    """Validate and store a batch of webhooks in the caller's transaction.

    Every refusal is the answer of its own request only: the others of the batch
    are stored all the same. ``count=False``: the executions are not added to the
    counts (a request whose count cannot be written, see ``WebhookBatcher._commit``).
    """
    limits = limits or WebhookLimits()
    flow_ids = sorted({r.flow_id for r in batch})
    flows = {f.id: f for f in (_FlowRow(*r) for r in await _FLOWS.all(session, {"ids": flow_ids}))}
    now = utcnow()
    out: dict[int, Accepted | FlowyardError] = {}
    new: list[queue.NewExecution] = []
    keys_seen: dict[tuple[str, str], tuple[str, str]] = {}
    clock = now.timestamp()
    candidates: list[int] = []
    for i, req in enumerate(batch):
        flow = flows.get(req.flow_id)
        if flow is None or flow.status != FlowStatus.ACTIVE:
            out[i] = not_found(req.flow_id)
            continue
        if flow.cron:
            out[i] = Conflict(f"Flow {req.flow_id} runs on a schedule and takes no webhooks.")
            continue
        if flow.webhook_secret and req.trigger == "webhook":
            secret = limits.webhook_secret(flow.webhook_secret)
            if limits.verify is None:
                refused: FlowyardError | None = Unauthorized("The webhook's signature cannot be checked.")
            elif secret is None:
                refused = Unauthorized(
                    "X-Flowyard-Signature cannot be checked (the flow's secret cannot be read with "
                    "this service's key)."
                )
            else:
                refused = limits.verify(secret, req.raw, req.signature, clock, limits.signature_tolerance)
            if refused is not None:
                out[i] = refused
                continue
        candidates.append(i)
    if limits.rate > 0 and candidates:
        wanted = Counter(batch[i].flow_id for i in candidates)
        grants = await take_tokens(session, wanted, rate=limits.rate, burst=limits.burst, now=clock)
        kept = []
        for i in candidates:
            fid = batch[i].flow_id
            granted, retry_after = grants[fid]
            if granted > 0:
                grants[fid] = (granted - 1, retry_after)
                kept.append(i)
            else:
                out[i] = TooManyRequests(
                    f"Flow {fid} receives at most {limits.rate:g} webhooks per second; retry later.",
                    retry_after=retry_after,
                )
        candidates = kept
    for i in candidates:
        req = batch[i]
        flow = flows[req.flow_id]
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
                history_version=flow.history_version,
                flow_name=flow.name,
                tenant=flow.tenant,
                owner_user=queue.owner_user_of(flow.owners),
                trigger=req.trigger,
                input=req.payload,
                created_at=now,
            )
        )
        if req.idempotency_key is not None:
            keys_seen[(req.flow_id, req.idempotency_key)] = (req.body_hash, eid)
        out[i] = Accepted(eid, req.flow_id)
    await queue.enqueue(session, new, count=count)
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
