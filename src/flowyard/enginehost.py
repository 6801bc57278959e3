"""The engine's services in one process: worker, cron scheduler, lifecycle
reconciler and pruner. ``flowyard serve`` runs them beside the API;
``flowyard worker`` runs them alone (scale-out)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import timedelta

from flowyard import heap, metrics
from flowyard.clock import utcnow
from flowyard.components import builtins
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.queue import pruner
from flowyard.queue.hub import CompletionHub
from flowyard.queue.notify import Notifier, open_notifier
from flowyard.runtime.worker import Worker
from flowyard.secrets.crypto import SecretBox, load_key
from flowyard.triggers import lifecycle, scheduler
from flowyard.triggers.consumers import TriggerConsumers

log = logging.getLogger(__name__)


class EngineServices:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        registry: Registry,
        *,
        box: SecretBox,
        hub: CompletionHub | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.registry = registry
        self.box = box
        self.hub = hub or CompletionHub()
        self.notifier = notifier or Notifier()
        self.worker = Worker(db, settings, registry, box=box, hub=self.hub, notifier=self.notifier)
        # Work enqueued by another process (an API process's webhook) wakes this worker at once.
        self.notifier.subscribe(on_work=self.worker.wake)
        self._lifecycle_wake = asyncio.Event()
        self._scheduler_wake = asyncio.Event()
        self.triggers = TriggerConsumers(
            db,
            settings,
            registry,
            box=box,
            notifier=self.notifier,
            on_work=self.worker.wake,
            nudge_lifecycle=self.nudge_lifecycle,
            holder=lambda: self.worker.id,
        )
        self.worker.on_triggers_freed = self.triggers.wake.set
        self._tasks: list[asyncio.Task[None]] = []
        self._worker_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._worker_task = asyncio.create_task(self.worker.run(), name="flowyard-worker")
        # Activate flows and fire cron ticks only once this engine can run them: an engine
        # whose runners are still starting would otherwise hold work it cannot start.
        await self.worker.pool.wait_ready()
        # Trigger leases are held under the heartbeat id: none before the heartbeat exists (or
        # the worker failed to start, whose error its task carries).
        registered = asyncio.create_task(self.worker.registered.wait())
        await asyncio.wait([registered, self._worker_task], return_when=asyncio.FIRST_COMPLETED)
        registered.cancel()
        self._tasks = [
            asyncio.create_task(self._every("lifecycle", self._lifecycle_pass, 1.0, self._lifecycle_wake)),
            asyncio.create_task(self._scheduler_loop(), name="flowyard-scheduler"),
            asyncio.create_task(self._every("pruner", self._prune_pass, self.settings.prune_interval, None)),
            asyncio.create_task(
                self._every("triggers", self.triggers.run_pass, self.triggers.interval, self.triggers.wake)
            ),
        ]

    async def stop(self, *, force: bool = False) -> None:
        """Stop claiming and scheduling; running executions finish within the stop grace and
        what is left goes back to the queue. ``force``: hand everything back at once. May be
        called again (a second signal) while a first call waits."""
        for task in self._tasks:
            task.cancel()
        self.worker.stop(force=force)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.triggers.close()
        if self._worker_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._worker_task)

    def nudge_lifecycle(self) -> None:
        self._lifecycle_wake.set()
        if hasattr(self, "triggers"):
            self.triggers.wake.set()  # a flow that starts or stops: its consumer too

    def wake_worker(self) -> None:
        self.worker.wake()

    async def _lifecycle_pass(self) -> None:
        if await lifecycle.reconcile(
            self.db,
            self.registry,
            self.box,
            stop_grace=self.settings.stop_grace_seconds,
            bound=self.settings.lifecycle_timeout,
        ):
            self._scheduler_wake.set()

    async def _prune_pass(self) -> None:
        counts = await pruner.prune(
            self.db, retention=timedelta(days=self.settings.retention_days), batch=self.settings.prune_batch
        )
        if any(counts.values()):
            log.info("pruned %s", counts)

    async def _every(
        self, name: str, fn: Callable[[], Awaitable[None]], interval: float, wake: asyncio.Event | None
    ) -> None:
        while True:
            try:
                await fn()
            except Exception:
                log.exception("%s pass failed", name)
            if wake is None:
                await asyncio.sleep(interval)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await wake.wait()
            wake.clear()

    async def _scheduler_loop(self) -> None:
        while True:
            delay = self.settings.scheduler_interval
            try:
                if await scheduler.fire_due(self.db, overlap=self.settings.cron_overlap):
                    self.worker.wake()
                nxt = await scheduler.next_due(self.db)
                if nxt is not None:
                    # A floor, so a tick that keeps failing cannot spin the loop.
                    delay = min(delay, max((nxt - utcnow()).total_seconds(), 0.02))
            except Exception:
                log.exception("scheduler pass failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay + 0.001):
                    await self._scheduler_wake.wait()
            self._scheduler_wake.clear()


async def run_standalone(settings: Settings) -> None:
    """``flowyard worker``: the engine without the API, until SIGINT/SIGTERM."""
    db = Database(settings.resolved_database_url(), direct=settings.sqlite_direct)
    key = settings.configured_secret_key()
    notifier = open_notifier(settings.resolved_database_url(), settings.notify_database_url)
    await notifier.start()
    engine = EngineServices(
        db,
        settings,
        Registry.load(builtins.ALL),
        box=SecretBox(load_key(key, settings.data_dir)),
        notifier=notifier,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # The first signal drains (see EngineServices.stop); a second one hands back at once.
        if stop.is_set():
            log.warning("second stop signal: handing back running executions now")
            engine.worker.stop(force=True)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    listener = None
    if settings.metrics_port is not None:
        token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
        listener = await metrics.serve_metrics(settings.host, settings.metrics_port, token)
        log.info("metrics on http://%s:%d/metrics", settings.host, settings.metrics_port)
    await engine.start()
    heap.settle()
    log.info("worker %s started", engine.worker.id)
    try:
        await stop.wait()
        log.info("stopping: finishing running executions (up to %g s)", settings.stop_grace_seconds)
    finally:
        await engine.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if listener is not None:
            listener.close()
        await notifier.close()
        await db.dispose()
