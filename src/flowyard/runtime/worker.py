"""The worker: claims queued executions, has them run, records their outcomes.

Shape after procrastinate's worker: a bounded number of executions run at once;
the loop wakes on the first of "work was enqueued here", "capacity freed",
the poll interval, or stop. Side tasks renew the leases of what runs here and
re-queue what dead workers left behind. Outcomes are written in batches (one
transaction for many finished executions) so durability does not cost
throughput. Flow code never runs in this process: the runner pool
(``flowyard.runtime.pool``) runs it in supervised runner processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import isolate, logconfig, metrics
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.flows.models import Flow, FlowVersion
from flowyard.ids import new_id
from flowyard.queue import heartbeat
from flowyard.queue import store as queue
from flowyard.queue.hub import CompletionHub
from flowyard.queue.notify import WORK, Notifier, finished_messages
from flowyard.queue.status import ExecutionStatus
from flowyard.runtime.pool import FlowSpec, RunnerPool
from flowyard.runtime.runner import CompiledFlow, FlowNotRunnable, error_outcome
from flowyard.secrets import service as secrets
from flowyard.secrets.crypto import SecretBox

log = logging.getLogger(__name__)

_CLAIM_BATCH = 64
_CREDENTIALS_TTL = 60.0
_FLUSH_BATCH = 256
# While a claim held work back at a tenant's cap, the worker claims again this often at the
# latest: a slot freed by another process's completion is taken up within it.
_HELD_BACK_POLL = 0.5


async def _lease_expired(_session: AsyncSession) -> None:
    return None


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
        self.id = self._new_id()
        self.pool = pool or RunnerPool(settings)
        self._wake = asyncio.Event()
        self._flush_wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._registered = False
        # Set once the first heartbeat is committed: trigger leases are taken under ``self.id``
        # only after that, so a lease holder always has a heartbeat another engine can see stop.
        self.registered = asyncio.Event()
        # Called after trigger leases of dead processes were freed (the consumers take them).
        self.on_triggers_freed: Callable[[], None] = lambda: None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._outcomes: list[queue.Outcome] = []
        self._flush_lock = asyncio.Lock()
        self._flows: dict[tuple[str, int], FlowSpec | FlowNotRunnable] = {}
        self._ran: dict[str, tuple[str, float]] = {}  # execution id: trigger, run seconds (metrics)
        self.completed = 0
        self.cap = settings.tenant_running_cap()
        # The last claim passed over queued work of a tenant at its cap: claim again as soon
        # as a run of this worker's ends (its slot is free before its record: ``_claim``'s
        # ``finished``), or within _HELD_BACK_POLL (slots other processes freed).
        self._held_back = False
        # Whether a claim may find anything: set by ``wake()``, by a claim that filled its limit,
        # by a run that ends while held back, and by the poll; cleared when a claim finds less
        # than it asked for. A slot freed here (an outcome in) wakes the loop too, but claims
        # only while this is set: after a claim that emptied the queue, another claim would
        # find nothing (and on PostgreSQL cost ~5 statements).
        self._claimable = True
        # The resumer (SPEC §11): wakes at the earliest due time it knows of, or when this
        # worker parks an execution due sooner.
        self._resume_wake = asyncio.Event()
        self._next_due: float | None = None  # time.time() of the earliest known due execution
        self.parked = 0
        self.resumed = 0

    @staticmethod
    def _new_id() -> str:
        # The lease owner of what this process holds and the id of its heartbeat row.
        return f"{socket.gethostname()}:{os.getpid()}:{new_id()[-8:]}"

    def wake(self) -> None:
        """Work may be claimable: enqueued (in any process; by a record: a sub-flow's child,
        an error flow), re-queued or resumed."""
        self._claimable = True
        self._wake.set()

    async def run(self) -> None:
        """Run until ``stop()``; then finish what runs within the grace period."""
        await self.pool.start()
        if not await self.pool.wait_ready():
            log.error("no runner process started yet; executions wait for one")
        # Registered before the first claim, so everything claimed is attributable to a heartbeat.
        await self._beat()
        side = [
            asyncio.create_task(self._heartbeat(), name="flowyard-heartbeat"),
            asyncio.create_task(self._flusher(), name="flowyard-flusher"),
            asyncio.create_task(self._renewer(), name="flowyard-lease-renewer"),
            asyncio.create_task(self._reaper(), name="flowyard-reaper"),
            asyncio.create_task(self._resumer(), name="flowyard-resumer"),
        ]
        try:
            await self._loop(side)
        finally:
            await self._shutdown(side)

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming; running executions finish within the stop grace, unless ``force``
        (a second signal): then they are handed back at once."""
        self._stopping.set()
        if force:
            self._force.set()
        self._wake.set()

    async def _loop(self, side: list[asyncio.Task[None]]) -> None:
        while not self._stopping.is_set():
            for task in side:
                if task.done():  # a crashed side task stops the worker: better than silently not renewing
                    task.result()
            self._wake.clear()
            capacity = min(self.settings.worker_concurrency, self.pool.slots) - len(self._running)
            if capacity > 0 and self._claimable:
                limit = min(capacity, _CLAIM_BATCH)
                self._claimable = False  # a wake() during the claim sets it again
                try:
                    claimed = await self._claim(limit)
                except Exception:
                    log.exception("claiming executions failed; retrying")
                    claimed = []
                    self._claimable = True
                    await asyncio.sleep(self.settings.poll_interval)
                if len(claimed) >= limit:
                    self._claimable = True  # perhaps more queued than this claim could take
                if claimed:
                    try:
                        await self._start(claimed)
                    except Exception:  # the database, for a moment: none of them started
                        log.exception(
                            "starting %d claimed executions failed; handing them back", len(claimed)
                        )
                        await self._hand_back(
                            [c.id for c in claimed if c.id not in self._running], started=False
                        )
                        self._claimable = True
                        await asyncio.sleep(self.settings.poll_interval)
                    continue
            poll = self.settings.poll_interval
            if self._held_back:
                poll = min(poll, _HELD_BACK_POLL)
            try:
                async with asyncio.timeout(poll):
                    await self._wake.wait()
            except TimeoutError:
                self._claimable = True  # the backstop: work another process queued or freed unseen

    async def _claim(self, limit: int) -> list[queue.Claimed]:
        unreadable: list[queue.Unreadable] = []
        messages: list[bytes] = []
        held_back: set[str] = set()
        # Run, their outcomes not yet recorded: they hold no slot of their tenant's cap.
        finished = [o.execution_id for o in self._outcomes]

        async def transaction(session: AsyncSession) -> list[queue.Claimed]:
            nonlocal messages
            claimed = await queue.claim(
                session,
                worker_id=self.id,
                limit=limit,
                lease_seconds=self.settings.lease_seconds,
                cap=self.cap,
                unreadable=unreadable,
                held_back=held_back,
                finished=finished,
            )
            if unreadable:  # failed alone in this transaction (isolate.py); waiters are told
                messages = finished_messages((u.id, "failed", None, u.error) for u in unreadable)
                await self.notifier.stage(session, messages)
            return claimed

        claimed = await self.db.transact(transaction, durable=False)
        if unreadable:
            self.notifier.committed(messages)
            for u in unreadable:
                log.error("execution %s of flow %s failed: %s", u.id, u.flow_id, u.error)
                metrics.poison("claim")
                metrics.execution_finished(u.trigger, "failed", None)
            self.hub.finish((u.id, ("failed", None, u.error)) for u in unreadable)
        self._held_back = bool(held_back)
        if held_back:
            metrics.claims_held_back(len(held_back))
            log.debug(
                "claim held back the queued executions of %d queue groups at their cap of %d running: %s",
                len(held_back),
                self.cap,
                sorted(held_back)[:5],
            )
        return claimed

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
                # As text, decoded flow by flow: one flow whose row cannot be read fails its own
                # executions, not the claim (isolate.py).
                rows = (
                    await session.execute(
                        sa.select(
                            Flow.id,
                            Flow.version,
                            Flow.tenant,
                            sa.cast(Flow.owners, sa.Text),
                            sa.cast(Flow.graph, sa.Text),
                            Flow.history_version,
                        ).where(Flow.id.in_(missing))
                    )
                ).all()
                # An execution accepted before its flow's graph changed (a retry, a replay, a
                # queued one) runs the version it names (SPEC §12), not the flow's current one.
                now_at = {r[0]: (r[1], r[5]) for r in rows}
                older = {
                    (c.flow_id, c.flow_version, c.history_version)
                    for c in claimed
                    if (c.flow_id, c.flow_version) not in self._flows
                    and c.flow_id in now_at
                    and c.flow_version != now_at[c.flow_id][0]
                    and c.history_version is not None
                    and c.history_version != now_at[c.flow_id][1]
                }
                old_graphs: dict[tuple[str, int], str] = {}
                for fid, row_version, number in older:
                    graph_text = await session.scalar(
                        sa.select(sa.cast(FlowVersion.graph, sa.Text)).where(
                            FlowVersion.flow_id == fid, FlowVersion.number == number
                        )
                    )
                    if graph_text is not None:
                        old_graphs[(fid, row_version)] = graph_text
            loads: list[tuple[str, int, str | None, str, str]] = [
                (r[0], r[1], r[2], r[3], r[4]) for r in rows
            ] + [
                (fid, row_version, r[2], r[3], graph_text)
                for (fid, row_version), graph_text in old_graphs.items()
                for r in rows
                if r[0] == fid
            ]
            for fid, version, tenant, owners, graph in loads:
                try:
                    spec = await self._prepare(fid, version, tenant, owners, graph)
                except Exception as exc:
                    if isolate.is_transient(exc):
                        raise
                    why = f"the flow could not be prepared: {isolate.reason(exc)}"
                    log.error("flow %s version %s: %s", fid, version, why)
                    metrics.poison("claim")
                    spec = FlowNotRunnable(why)
                self._flows[(fid, version)] = spec
                if (fid, version) not in old_graphs:
                    current[fid] = spec
        metrics.executions_started([c.trigger for c in claimed])
        for c in claimed:
            flow = self._flows.get((c.flow_id, c.flow_version)) or current.get(c.flow_id)
            self._running[c.id] = asyncio.create_task(self._execute(c, flow), name=f"flowyard-exec-{c.id}")

    async def _prepare(
        self, fid: str, version: int, tenant: str | None, owners: str, graph_text: str
    ) -> FlowSpec | FlowNotRunnable:
        """Vet a flow version for the runners: compiled here only to check the graph and find
        its credentials (runners compile their own copy from the spec)."""
        graph = orjson.loads(graph_text)
        compiled: CompiledFlow | FlowNotRunnable
        try:
            compiled = CompiledFlow.compile(
                flow_id=fid,
                version=version,
                tenant=tenant,
                owner_user=queue.owner_user_of(orjson.loads(owners)),
                graph=graph,
                registry=self.registry,
            )
        except FlowNotRunnable as exc:
            return exc
        if compiled.credential_ids:
            async with self.db.read() as session:
                compiled.credentials, _problems = await secrets.resolve(
                    session,
                    self.box,
                    compiled.credential_ids,
                    tenant=tenant,
                    owner_user=compiled.owner_user,
                )
        return FlowSpec.of(compiled, graph)

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
                    status=ExecutionStatus.FAILED if flow is not None else ExecutionStatus.CANCELLED,
                    error=reason,
                    log_message=f"execution not run: {reason}",
                )
            self._ran[claimed.id] = (claimed.trigger, time.monotonic() - started)
            self._outcomes.append(outcome)
            self._flush_wake.set()
            if self._held_back:
                self._claimable = True  # its tenant's slot is free now, though not yet recorded
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
        # One flusher at a time; an outcome leaves the buffer only once it is committed (or
        # settled as poison), so a failed or cancelled write loses nothing.
        async with self._flush_lock:
            batch = self._outcomes[:_FLUSH_BATCH]
            if not batch:
                return
            settled: set[int] = set()
            try:
                # One transaction for the batch; an outcome that breaks it is recorded alone as
                # failed and never blocks the others (isolate.py).
                left = await isolate.bisect(
                    batch,
                    lambda part: self._record(part, settled),
                    lambda o, exc: self._record_poison(o, exc, settled),
                )
            finally:
                if settled:
                    self._outcomes = [o for o in self._outcomes if id(o) not in settled]
            if left.items:
                log.error(
                    "recording %d outcomes failed (%s); retrying",
                    len(left.items),
                    isolate.reason(left.error) if left.error else "?",
                )
                await asyncio.sleep(0.5)

    async def _record(self, batch: Sequence[queue.Outcome], settled: set[int], *, count: bool = True) -> None:
        """Record ``batch`` in one transaction; then what follows its commit."""
        started: list[str] = []
        woken: list[str] = []

        async def transaction(session: AsyncSession) -> tuple[set[str], list[bytes]]:
            held = await queue.complete(
                session,
                batch,
                worker_id=self.id,
                count=count,
                max_flow_depth=self.settings.flow_max_depth,
                started=started,
                woken=woken,
            )
            # Sent with the commit: API processes answer their ?wait= requests from it. A parked
            # execution has not finished: nobody is told.
            messages = finished_messages(
                (o.execution_id, o.status, o.result, o.error)
                for o in batch
                if o.execution_id in held and o.status != ExecutionStatus.WAITING
            )
            if started:  # sub-flows' children (SPEC §12), error flows (§11): every engine may claim them
                messages.append(WORK)
            await self.notifier.stage(session, messages)
            return held, messages

        held, messages = await self.db.transact(transaction, durable=False)
        settled.update(id(o) for o in batch)
        if woken:  # their children finished: the parents are due now
            self._due_at(time.time())
        if started:
            self.wake()
        lost = [o.execution_id for o in batch if o.execution_id not in held]
        if lost:
            log.warning(
                "dropped outcomes of %d executions this worker no longer holds: %s", len(lost), lost[:5]
            )
        parked = [o for o in batch if o.execution_id in held and o.status == ExecutionStatus.WAITING]
        self.completed += len(batch) - len(lost) - len(parked)
        self.parked += len(parked)
        for o in batch:
            trigger, seconds = self._ran.pop(o.execution_id, ("other", -1.0))
            if o.execution_id in held and o.status != ExecutionStatus.WAITING:
                metrics.execution_finished(trigger, o.status, seconds)
        for o in parked:
            if o.resume_at is not None:
                self._due_at(o.resume_at.timestamp())
        self.notifier.committed(messages)
        self.hub.finish(
            (
                (o.execution_id, (o.status, o.result, o.error))
                for o in batch
                if o.execution_id in held and o.status != ExecutionStatus.WAITING
            ),
            remember=False,
        )

    async def _record_poison(self, outcome: queue.Outcome, exc: BaseException, settled: set[int]) -> None:
        """An outcome that cannot be recorded. If only its counts broke, it is recorded
        uncounted; otherwise the execution is recorded ``failed`` with the reason, no result and
        no steps. Raises (the outcome stays buffered) if even that cannot be written."""
        why = isolate.reason(exc)
        # Once more as it is (what failed may have been a moment's conflict), then, in case only
        # its count broke (queue/counters.py), uncounted.
        counted = await isolate.write_alone(lambda count: self._record([outcome], settled, count=count))
        if counted is False:
            log.error("execution %s: recorded without counting its steps: %s", outcome.execution_id, why)
            metrics.poison("count")
        if counted is not None:
            return
        error = f"its outcome could not be stored: {why}"
        log.error("execution %s failed: %s", outcome.execution_id, error)
        metrics.poison("outcome")
        failed = error_outcome(
            _claimed_of(outcome), status=ExecutionStatus.FAILED, error=error, log_message=error
        )
        await self._record([failed], set())
        settled.add(id(outcome))

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
                await self._interrupt_cancelled(ids)
            except Exception:
                log.exception("renewing leases failed")

    async def _interrupt_cancelled(self, ids: Sequence[str]) -> None:
        """Stop running what was cancelled meanwhile (``POST /executions/{id}/cancel``, SPEC §11):
        the task is cancelled, so the pool tells the runner to cancel the running step (an awaiting
        step stops at once; a step busy in CPU stops at its limits). Its outcome would be dropped
        anyway (``queue.complete`` records only what is still running)."""
        async with self.db.read() as session:
            cancelled = await queue.cancelled_among(session, ids)
        for eid in cancelled:
            task = self._running.get(eid)
            if task is not None:
                log.info("execution %s was cancelled: interrupting it", eid)
                task.cancel()

    async def _reaper(self) -> None:
        interval = max(self.settings.lease_seconds / 2, 0.5)
        while True:
            await asyncio.sleep(interval)
            try:
                requeued, _ = await self._take_back(_lease_expired)
                if requeued:
                    log.warning("re-queued %d executions whose worker's lease expired", requeued)
            except Exception:
                log.exception("reaping expired leases failed")

    def _due_at(self, when: float) -> None:
        """An execution parked here is due at ``when`` (``time.time()``): the resumer wakes then."""
        if self._next_due is None or when < self._next_due:
            self._next_due = when
            self._resume_wake.set()

    async def _resumer(self) -> None:
        """Move due waiting executions to the queue (SPEC §11), in every engine process: each
        is moved once (``queue.resume_due``), then any worker claims it. Looks every
        FLOWYARD_RESUME_POLL_SECONDS, and at the earliest due time it knows of."""
        poll = self.settings.resume_poll_seconds
        while True:
            try:
                moved = await self.resume_once()
                if moved:
                    continue  # perhaps more are due
                async with self.db.read() as session:
                    nxt = await queue.next_due(session)
                self._next_due = nxt.timestamp() if nxt is not None else None
            except Exception:
                log.exception("resuming waiting executions failed")
            wait = poll
            if self._next_due is not None:
                wait = min(poll, max(self._next_due - time.time(), 0.0) + 0.005)
            self._resume_wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._resume_wake.wait()

    async def resume_once(self) -> int:
        """Queue the waiting executions that are due now; how many were moved."""
        async with self.db.write(durable=False) as session:
            ids = await queue.resume_due(session)
            if ids:
                await self.notifier.stage(session, [WORK])
        if not ids:
            return 0
        self.notifier.committed([WORK])
        self.resumed += len(ids)
        log.debug("resumed %d waiting executions", len(ids))
        self.wake()
        return len(ids)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            try:
                await self._beat()
            except Exception:
                log.exception("heartbeat failed")

    async def _beat(self) -> None:
        """Renew this process's heartbeat, and take back the work of processes whose
        heartbeat stopped (``flowyard.queue.heartbeat``), in one transaction."""
        alive = True

        async def beat_and_find_dead(session: AsyncSession) -> list[str]:
            nonlocal alive
            alive = await heartbeat.beat(session, self.id)
            return await heartbeat.take_dead(
                session, me=self.id, after_seconds=self.settings.heartbeat_timeout_seconds
            )

        # The dead rows' deletion and the release of their executions commit together.
        requeued, dead = await self._take_back(beat_and_find_dead)
        if not alive and self._registered:
            # Declared dead while alive (too slow to beat): what this process held went back to
            # the queue for others. It takes a new id, so it records no outcome for any of that
            # (``queue.complete`` checks the holder), stops running it, and hands back what it
            # may have claimed under the old id after it was declared dead.
            old, self.id = self.id, self._new_id()
            log.error("heartbeat %s was taken over by another process; continuing as %s", old, self.id)
            for task in list(self._running.values()):
                task.cancel()
            self.on_triggers_freed()  # its trigger leases went too: the consumers close theirs

            async def beat_as_new(session: AsyncSession) -> list[str]:
                await heartbeat.beat(session, self.id)
                return [old]

            await self._take_back(beat_as_new)
        self._registered = True
        self.registered.set()
        if dead:
            log.warning("processes %s stopped beating; took back %d of their executions", dead[:5], requeued)

    async def _take_back(
        self, find: Callable[[AsyncSession], Awaitable[list[str] | None]]
    ) -> tuple[int, list[str] | None]:
        """Re-queue what dead workers held, in one transaction with ``find``, which names the
        dead (their heartbeat stopped) or answers None (those whose lease expired)."""
        messages: list[bytes] = []
        freed: list[str] = []
        async with self.db.write(durable=False) as session:
            owners = await find(session)
            requeued, dead = await queue.reap(session, max_attempts=self.settings.max_attempts, owners=owners)
            if owners:
                # Their event-trigger leases too: a consumer here takes each over at once.
                freed = await heartbeat.free_trigger_leases(session, owners)
            if dead:
                messages = finished_messages(e.id for e in dead)
            if requeued or dead:  # the dead may have started error flows (SPEC §11)
                messages.append(WORK)  # every engine claims, not only this one
            await self.notifier.stage(session, messages)
        self.notifier.committed(messages)
        metrics.lease_expiries(requeued)
        for e in dead:
            metrics.execution_finished(e.trigger, ExecutionStatus.FAILED, None)
        if requeued or dead:
            self.wake()
        if dead:
            self.hub.notify(e.id for e in dead)
        if freed:
            log.warning("freed the event-trigger leases of flows %s held by %s", freed[:5], owners)
            self.on_triggers_freed()
        return requeued, owners

    async def _shutdown(self, side: list[asyncio.Task[None]]) -> None:
        # Claimed but not started (waiting for a runner slot): handed back at once.
        waiting = self.pool.waiting_ids() & set(self._running)
        await self._hand_back(sorted(waiting), started=False)
        unfinished: list[str] = []
        if self._running:
            log.info(
                "stopping: %d executions running, up to %g s to finish",
                len(self._running),
                self.settings.stop_grace_seconds,
            )
            force = asyncio.create_task(self._force.wait())
            deadline = time.monotonic() + self.settings.stop_grace_seconds
            while self._running and not force.done() and (left := deadline - time.monotonic()) > 0:
                await asyncio.wait(
                    [*self._running.values(), force], timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
            force.cancel()
            pending = dict(self._running)
            unfinished = list(pending)
            for task in pending.values():
                task.cancel()
            await asyncio.gather(*pending.values(), return_exceptions=True)
        # Their outcomes first (it is the same rows), then what ran past the grace goes back.
        with contextlib.suppress(Exception):
            while self._outcomes:
                await self._flush_once()
        await self._hand_back(unfinished, started=True)
        await self.pool.close()
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with self.db.write(durable=False) as session:
                await heartbeat.remove(session, self.id)

    async def _hand_back(self, ids: list[str], *, started: bool) -> None:
        """Release executions to the queue now rather than after their lease, and wake
        every engine to claim them."""
        if not ids:
            return
        for eid in ids:
            task = self._running.get(eid)
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for e in ids if (t := self._running.get(e)) is not None), return_exceptions=True
        )
        try:
            async with self.db.write(durable=False) as session:
                released = await queue.release(session, worker_id=self.id, ids=ids, started=started)
                await self.notifier.stage(session, [WORK])
            self.notifier.committed([WORK])
            log.warning("handed back %d executions to the queue", released)
        except Exception:
            log.exception("handing back %d executions failed; their leases will expire", len(ids))

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "running": len(self._running),
            "completed": self.completed,
            "parked": self.parked,
            "resumed": self.resumed,
            "pool": self.pool.stats(),
        }


def _claimed_of(outcome: queue.Outcome) -> queue.Claimed:
    """Who an outcome is about, for ``error_outcome`` (the rest is not needed to fail it)."""
    return queue.Claimed(
        id=outcome.execution_id,
        flow_id=outcome.flow_id,
        flow_version=0,
        tenant=outcome.tenant,
        owner_user=outcome.owner_user,
        trigger="",
        input=None,
        attempts=0,
        created_at=outcome.created_at,
        scheduled_for=None,
    )
