"""The worker: claims queued executions, has them run, records their outcomes.

Shape after procrastinate's worker: a bounded number of executions run at once;
the loop wakes on the first of "work was enqueued here", "capacity freed",
the poll interval, or stop. Side tasks renew the leases of what runs here and
re-queue what dead workers left behind. Outcomes are written in batches (one
transaction for many finished executions) so durability does not cost
throughput. Flow code never runs in this process: the runner pool
(``flowyard.engine.pool``) runs it in supervised runner processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import Any

import sqlalchemy as sa

from flowyard import logconfig, metrics
from flowyard.clock import utcnow
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.engine import queue
from flowyard.engine.components import Registry
from flowyard.engine.hub import CompletionHub
from flowyard.engine.notify import Notifier, finished_messages
from flowyard.engine.pool import FlowSpec, RunnerPool
from flowyard.engine.runner import CompiledFlow, FlowNotRunnable, error_outcome
from flowyard.flows.models import Flow
from flowyard.ids import new_id
from flowyard.logs.models import LogEntry
from flowyard.secrets import service as secrets
from flowyard.secrets.crypto import SecretBox

log = logging.getLogger(__name__)

_CLAIM_BATCH = 64
_CREDENTIALS_TTL = 60.0
_FLUSH_BATCH = 256


class Worker:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        registry: Registry,
        *,
        box: SecretBox,
        hub: CompletionHub | None = None,
        pool: RunnerPool | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.box = box
        self.notifier = notifier or Notifier()
        self.db = db
        self.settings = settings
        self.registry = registry
        self.hub = hub or CompletionHub()
        self.id = f"{socket.gethostname()}:{os.getpid()}:{new_id()[-8:]}"
        self.pool = pool or RunnerPool(settings)
        self._wake = asyncio.Event()
        self._flush_wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._outcomes: list[queue.Outcome] = []
        self._flush_lock = asyncio.Lock()
        self._flows: dict[tuple[str, int], FlowSpec | FlowNotRunnable] = {}
        self._ran: dict[str, tuple[str, float]] = {}  # execution id: trigger, run seconds (metrics)
        self.completed = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Run until ``stop()``; then finish what runs within the grace period."""
        await self.pool.start()
        if not await self.pool.wait_ready():
            log.error("no runner process started yet; executions wait for one")
        side = [
            asyncio.create_task(self._flusher(), name="flowyard-flusher"),
            asyncio.create_task(self._renewer(), name="flowyard-lease-renewer"),
            asyncio.create_task(self._reaper(), name="flowyard-reaper"),
        ]
        try:
            await self._loop(side)
        finally:
            await self._shutdown(side)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def _loop(self, side: list[asyncio.Task[None]]) -> None:
        while not self._stopping.is_set():
            for task in side:
                if task.done():  # a crashed side task stops the worker: better than silently not renewing
                    task.result()
            self._wake.clear()
            capacity = min(self.settings.worker_concurrency, self.pool.slots) - len(self._running)
            if capacity > 0:
                try:
                    claimed = await self._claim(min(capacity, _CLAIM_BATCH))
                except Exception:
                    log.exception("claiming executions failed; retrying")
                    claimed = []
                    await asyncio.sleep(self.settings.poll_interval)
                if claimed:
                    await self._start(claimed)
                    continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_interval):
                    await self._wake.wait()

    async def _claim(self, limit: int) -> list[queue.Claimed]:
        async with self.db.write(durable=False) as session:
            return await queue.claim(
                session, worker_id=self.id, limit=limit, lease_seconds=self.settings.lease_seconds
            )

    async def _start(self, claimed: list[queue.Claimed]) -> None:
        now = time.monotonic()
        for key, cached in list(self._flows.items()):
            # Flows using credentials are re-read now and then, so a changed secret takes effect.
            if (
                isinstance(cached, FlowSpec)
                and cached.credentials
                and now - cached.loaded_at > _CREDENTIALS_TTL
            ):
                del self._flows[key]
        missing = {c.flow_id for c in claimed if (c.flow_id, c.flow_version) not in self._flows}
        current: dict[str, FlowSpec | FlowNotRunnable] = {}
        if missing:
            async with self.db.read() as session:
                rows = (
                    await session.execute(
                        sa.select(Flow.id, Flow.version, Flow.tenant, Flow.owners, Flow.graph).where(
                            Flow.id.in_(missing)
                        )
                    )
                ).all()
            for fid, version, tenant, owners, graph in rows:
                # Compiled here only to vet the graph and find its credentials; runners compile
                # their own copy from the spec.
                compiled: CompiledFlow | FlowNotRunnable
                try:
                    compiled = CompiledFlow.compile(
                        flow_id=fid,
                        version=version,
                        tenant=tenant,
                        owner_user=queue.owner_user_of(owners),
                        graph=graph,
                        registry=self.registry,
                    )
                except FlowNotRunnable as exc:
                    compiled = exc
                if isinstance(compiled, CompiledFlow) and compiled.credential_ids:
                    async with self.db.read() as session:
                        compiled.credentials, _problems = await secrets.resolve(
                            session,
                            self.box,
                            compiled.credential_ids,
                            tenant=tenant,
                            owner_user=compiled.owner_user,
                        )
                spec = FlowSpec.of(compiled, graph) if isinstance(compiled, CompiledFlow) else compiled
                self._flows[(fid, version)] = spec
                current[fid] = spec
        metrics.executions_started([c.trigger for c in claimed])
        for c in claimed:
            flow = self._flows.get((c.flow_id, c.flow_version)) or current.get(c.flow_id)
            self._running[c.id] = asyncio.create_task(self._execute(c, flow), name=f"flowyard-exec-{c.id}")

    async def _execute(self, claimed: queue.Claimed, flow: FlowSpec | FlowNotRunnable | None) -> None:
        logconfig.set_execution(claimed.flow_id, claimed.id, claimed.tenant)  # this task's log lines
        started = time.monotonic()
        try:
            if isinstance(flow, FlowSpec):
                outcome = await self.pool.run(flow, claimed)
            else:
                reason = str(flow) if flow is not None else "the flow no longer exists"
                outcome = error_outcome(
                    claimed,
                    status="failed" if flow is not None else "cancelled",
                    error=reason,
                    log_message=f"execution not run: {reason}",
                )
            self._ran[claimed.id] = (claimed.trigger, time.monotonic() - started)
            self._outcomes.append(outcome)
            self._flush_wake.set()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The pool always answers with an outcome; this is a bug. Leave the row to the reaper.
            log.exception("execution %s could not be run", claimed.id)
        finally:
            self._running.pop(claimed.id, None)
            self._wake.set()

    async def _flusher(self) -> None:
        while True:
            await self._flush_wake.wait()
            self._flush_wake.clear()
            while self._outcomes:
                await self._flush_once()

    async def _flush_once(self) -> None:
        # One flusher at a time; a batch leaves the buffer only once it is committed,
        # so a failed or cancelled write loses nothing.
        async with self._flush_lock:
            batch = self._outcomes[:_FLUSH_BATCH]
            if not batch:
                return
            messages: list[bytes] = []
            try:
                async with self.db.write(durable=False) as session:
                    held = await queue.complete(session, batch, worker_id=self.id)
                    # Sent with the commit: API processes answer their ?wait= requests from it.
                    messages = finished_messages(
                        (o.execution_id, o.status, o.result, o.error) for o in batch if o.execution_id in held
                    )
                    await self.notifier.stage(session, messages)
            except Exception:
                log.exception("recording %d outcomes failed; retrying", len(batch))
                await asyncio.sleep(0.5)
                return
            del self._outcomes[: len(batch)]
        lost = [o.execution_id for o in batch if o.execution_id not in held]
        if lost:
            log.warning(
                "dropped outcomes of %d executions this worker no longer holds: %s", len(lost), lost[:5]
            )
        self.completed += len(batch) - len(lost)
        for o in batch:
            trigger, seconds = self._ran.pop(o.execution_id, ("other", -1.0))
            if o.execution_id in held:
                metrics.execution_finished(trigger, o.status, seconds)
        self.notifier.committed(messages)
        self.hub.finish(
            ((o.execution_id, (o.status, o.result, o.error)) for o in batch if o.execution_id in held),
            remember=False,
        )

    async def _renewer(self) -> None:
        interval = self.settings.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            ids = list(self._running)
            if not ids:
                continue
            try:
                async with self.db.write(durable=False) as session:
                    await queue.renew(
                        session, worker_id=self.id, ids=ids, lease_seconds=self.settings.lease_seconds
                    )
            except Exception:
                log.exception("renewing leases failed")

    async def _reaper(self) -> None:
        interval = max(self.settings.lease_seconds / 2, 0.5)
        while True:
            await asyncio.sleep(interval)
            try:
                messages: list[bytes] = []
                async with self.db.write(durable=False) as session:
                    requeued, dead = await queue.reap(session, max_attempts=self.settings.max_attempts)
                    if dead:
                        messages = finished_messages(e.id for e in dead)
                        await self.notifier.stage(session, messages)
                    for e in dead:
                        session.add(
                            LogEntry(
                                timestamp=utcnow(),
                                level="error",
                                message=f"execution {e.id} failed: {e.error}",
                                tenant=e.tenant,
                                user_id=e.owner_user,
                                flow_id=e.flow_id,
                                execution_id=e.id,
                            )
                        )
                metrics.lease_expiries(requeued)
                for e in dead:
                    metrics.execution_finished(e.trigger, "failed", None)
                if requeued:
                    log.warning("re-queued %d executions whose worker's lease expired", requeued)
                    self.wake()
                if dead:
                    self.notifier.committed(messages)
                    self.hub.notify(e.id for e in dead)
            except Exception:
                log.exception("reaping expired leases failed")

    async def _shutdown(self, side: list[asyncio.Task[None]]) -> None:
        unfinished: list[str] = []
        if self._running:
            _done, pending = await asyncio.wait(
                self._running.values(), timeout=self.settings.stop_grace_seconds
            )
            unfinished = [eid for eid, task in self._running.items() if task in pending]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.pool.close()
        with contextlib.suppress(Exception):
            while self._outcomes:
                await self._flush_once()
        if unfinished:
            # Hand them back now rather than after the lease expires.
            with contextlib.suppress(Exception):
                async with self.db.write(durable=False) as session:
                    await session.execute(
                        sa.update(queue.Execution)
                        .where(
                            queue.Execution.id.in_(unfinished),
                            queue.Execution.lease_owner == self.id,
                            queue.Execution.status == "running",
                        )
                        .values(status="queued", lease_owner=None, lease_expires_at=None)
                        .execution_options(synchronize_session=False)
                    )
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "running": len(self._running),
            "completed": self.completed,
            "pool": self.pool.stats(),
        }
