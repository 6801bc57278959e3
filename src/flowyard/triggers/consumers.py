"""The engine's event-trigger consumers (docs/engine.md "Event triggers").

The holder of a lease is the engine's heartbeat id (``Worker.id``, passed in as
``holder``): when the process dies, the engine that sees its heartbeat stop frees
its leases in the same transaction and wakes its consumers, which take them over
at once (``Worker._take_back``, ``heartbeat.free_trigger_leases``).

Every pass (a third of ``FLOWYARD_LEASE_SECONDS``) an engine process renews the
trigger leases it holds, takes free or expired leases of flows that are
``starting`` or ``active``, and closes the consumers of flows that stopped or
whose lease it lost. A consumer only receives and stores: each event becomes an
execution row through the webhooks' acceptance path (``WebhookBatcher``, the
same idempotency keys), committed before the broker is acknowledged. No flow
code runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import sqlalchemy as sa

from flowyard import isolate, jsonvalue, metrics
from flowyard.clock import utcnow
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.errors import Conflict, FlowyardError, NotFound, StorageUnavailable, TooManyRequests
from flowyard.flows.models import Flow
from flowyard.flows.status import TRIGGERED
from flowyard.queue import store as queue
from flowyard.queue.accept import WebhookBatcher, WebhookRequest
from flowyard.queue.notify import Notifier
from flowyard.queue.trigger_lease import TriggerLease
from flowyard.secrets import service as secrets
from flowyard.secrets.crypto import SecretBox
from flowyard.triggers import leases as triggers
from flowyard.triggers import lifecycle

log = logging.getLogger(__name__)

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
_CAP = "FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES"


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


@dataclass
class _Consumer:
    flow_id: str
    task: asyncio.Task[None]


class TriggerConsumers:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        registry: Registry,
        *,
        box: SecretBox,
        notifier: Notifier,
        on_work: Callable[[], None],
        nudge_lifecycle: Callable[[], None],
        holder: Callable[[], str],
    ) -> None:
        self.db = db
        self.settings = settings
        self.registry = registry
        self.box = box
        self._holder = holder
        self.batcher = WebhookBatcher(
            db, window_ms=settings.webhook_group_commit_ms, notifier=notifier, on_commit=on_work
        )
        self.nudge_lifecycle = nudge_lifecycle
        self.consumers: dict[str, _Consumer] = {}
        self._renewed = time.monotonic()
        self.wake = asyncio.Event()

    @property
    def holder(self) -> str:
        """This engine's heartbeat id. It changes only when another process declared this one
        dead (and freed its leases): the next pass then finds none held and closes them."""
        return self._holder()

    @property
    def interval(self) -> float:
        # Renewal needs a third of the lease; noticing a flow that starts or stops in another
        # process (the API's start/stop) wants about a second.
        return max(min(self.settings.lease_seconds / 3, 1.0), 0.2)

    async def run_pass(self) -> None:
        try:
            await self._pass()
        except Exception:
            if time.monotonic() - self._renewed > self.settings.lease_seconds and self.consumers:
                # Could not renew for a whole lease: another process may hold them now.
                log.error("trigger leases could not be renewed; closing %d consumer(s)", len(self.consumers))
                for fid in list(self.consumers):
                    await self._close(fid, release=None)
            raise

    async def _pass(self) -> None:
        now = utcnow()
        seconds = self.settings.lease_seconds
        held: set[str] = set()
        if self.consumers:
            async with self.db.write() as session:
                held = await triggers.renew(session, self.holder, sorted(self.consumers), now, seconds)
        self._renewed = time.monotonic()
        async with self.db.read() as session:  # no write transaction while nothing is held
            rows = (
                await session.execute(
                    sa.select(TriggerLease.flow_id, TriggerLease.holder, TriggerLease.expires_at, Flow.status)
                    .join(Flow, Flow.id == TriggerLease.flow_id, isouter=True)
                    .limit(10000)
                )
            ).all()
        wanted = {r[0] for r in rows if r[3] in TRIGGERED}
        for fid in list(self.consumers):
            if fid not in held:
                log.warning("trigger lease of flow %s lost; closing its consumer", fid)
                await self._close(fid, release=None)
            elif fid not in wanted or self.consumers[fid].task.done():
                await self._close(fid, release="delete" if fid not in wanted else "free")
        for fid, holder, expires_at, status in rows:
            if status not in TRIGGERED or fid in self.consumers:
                continue
            if holder is not None and expires_at is not None and expires_at > now:
                continue
            async with self.db.write() as session:
                taken = await triggers.take(session, fid, self.holder, now, seconds)
            if taken:
                task = asyncio.create_task(self._consume(fid), name=f"flowyard-trigger-{fid}")
                self.consumers[fid] = _Consumer(fid, task)

    async def close(self) -> None:
        """Shutting down: unsubscribe and free the leases for another process at once."""
        for fid in list(self.consumers):
            await self._close(fid, release="free")
        await self.batcher.close()

    async def _close(self, flow_id: str, *, release: str | None) -> None:
        consumer = self.consumers.pop(flow_id, None)
        if consumer is not None:
            consumer.task.cancel()
            with contextlib.suppress(BaseException):
                await consumer.task  # closing the iterator unsubscribes
        if release is not None:
            with contextlib.suppress(Exception):
                async with self.db.write() as session:
                    await triggers.release(session, flow_id, self.holder, delete=release == "delete")
            self.nudge_lifecycle()

    async def _consume(self, flow_id: str) -> None:
        delay = BACKOFF_FIRST
        while True:
            component = "trigger"
            try:
                node, ctx = await self._prepare(flow_id)
                component = node.component.id
                events = node.events(ctx)
                try:
                    async for event in events:
                        await self._store(flow_id, component, event)
                        await event.ack()
                        delay = BACKOFF_FIRST
                finally:
                    aclose = getattr(events, "aclose", None)
                    if aclose is not None:
                        await aclose()  # unsubscribes
                raise ConnectionError("the consumer ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                wait = delay * random.uniform(0.8, 1.2)
                problem = f"{component}: reconnecting in {wait:.0f} s: {_error(exc)}"
                log.warning("flow %s: %s", flow_id, problem)
                with contextlib.suppress(Exception):
                    async with self.db.write() as session:
                        await triggers.mark(
                            session, flow_id, self.holder, subscribed_at=None, problem=problem
                        )
                    await lifecycle.trigger_status(self.db, flow_id, problem)
                await asyncio.sleep(wait)
                delay = min(delay * 2, BACKOFF_MAX)

    async def _prepare(self, flow_id: str) -> tuple[triggers.TriggerNode, triggers.TriggerContext]:
        async with self.db.read() as session:
            flow = await session.get(Flow, flow_id)
            if flow is None:
                raise LookupError(f"flow {flow_id} is gone")
            node = triggers.trigger_node(flow.graph, self.registry)
            if node is None:
                raise LookupError(f"flow {flow_id} has no event trigger")
            credentials = None
            if node.credentials_id:
                found, problems = await secrets.resolve(
                    session,
                    self.box,
                    [node.credentials_id],
                    tenant=flow.tenant,
                    owner_user=queue.owner_user_of(flow.owners),
                )
                if problems:
                    raise PermissionError(
                        f"credentials {node.credentials_id}: {problems[node.credentials_id]}"
                    )
                credentials = found[node.credentials_id]

        async def subscribed() -> None:
            async with self.db.write() as session:
                await triggers.mark(session, flow_id, self.holder, subscribed_at=utcnow(), problem=None)
            await lifecycle.trigger_status(self.db, flow_id, None)
            self.nudge_lifecycle()

        ctx = triggers.TriggerContext(
            flow_id=flow_id,
            node_id=node.node_id,
            fields=node.component.parse_fields(node.fields),
            credentials=credentials,
            settings=self.settings,
            subscribed=subscribed,
        )
        return node, ctx

    async def _store(self, flow_id: str, component: str, event: triggers.Event) -> None:
        """Commit the event's execution (or find the one a redelivery made); retries until it is
        stored or the consumer is closed: an unstored event is never acknowledged.

        A message over ``FLOWYARD_MAX_TRIGGER_PAYLOAD_BYTES`` (refused by its connector before it
        was read whole, ``Event.refused``, or found so here) and one that can never be stored (it
        nests deeper than ``jsonvalue.MAX_DEPTH``, its data cannot be encoded, the acceptance
        path refuses it for good) are refused alone (``isolate.py``): logged with the
        reason, counted, and acknowledged (the connector's ``ack`` may reject instead) so that the
        broker drops it instead of redelivering it to block the messages behind it."""
        if event.refused is not None:
            self._refuse(flow_id, component, event, event.refused)
            return
        if jsonvalue.depth_exceeds(event.data):
            self._refuse(flow_id, component, event, str(jsonvalue.TooDeep()))
            return
        try:
            raw = orjson.dumps(event.data)
        except TypeError as exc:  # orjson.JSONEncodeError: not JSON
            self._refuse(flow_id, component, event, isolate.reason(exc))
            return
        cap = self.settings.max_trigger_payload_bytes
        if len(raw) > cap:  # any trigger, also one that cannot check before reading
            self._refuse(flow_id, component, event, f"{len(raw)} bytes as JSON, over {cap} ({_CAP})")
            return
        request = WebhookRequest(
            flow_id=flow_id,
            payload=event.data,
            body_hash=hashlib.sha256(raw).hexdigest(),
            raw=raw,
            idempotency_key=triggers.idempotency_key(component, event.id),
            signature=None,
            trigger=component,
        )
        while True:
            try:
                await self.batcher.submit(request)
                return
            except Conflict as exc:
                # The same message id with another body within the idempotency window: the
                # producer reused an id. Stored nothing; acknowledged so it does not loop.
                log.error("flow %s: %s message %s not stored: %s", flow_id, component, event.id, exc)
                return
            except (NotFound, TooManyRequests, StorageUnavailable):
                # Not active yet (still starting), over its rate or the database is unavailable:
                # try again.
                await asyncio.sleep(0.5)
            except FlowyardError as exc:
                self._refuse(flow_id, component, event, str(exc))
                return

    @staticmethod
    def _refuse(flow_id: str, component: str, event: triggers.Event, why: str) -> None:
        log.error("flow %s: %s message %s refused and dropped: %s", flow_id, component, event.id, why)
        metrics.poison("trigger")
