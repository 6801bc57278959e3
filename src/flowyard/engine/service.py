"""The engine's services in one process: worker, scheduler, lifecycle reconciler, pruner."""

from __future__ import annotations

from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.engine.components import Registry


class EngineServices:
    def __init__(self, db: Database, settings: Settings, registry: Registry) -> None:
        self.db = db
        self.settings = settings
        self.registry = registry

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def nudge_lifecycle(self) -> None:
        pass
