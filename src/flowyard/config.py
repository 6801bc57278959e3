"""Settings, read once from ``FLOWYARD_*`` environment variables and passed down.

Nothing reads the environment at import time: the CLI and the app factory build a
``Settings`` and hand it to whatever needs it, and tests build their own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWYARD_", extra="ignore")

    # -- where things live -------------------------------------------------
    data_dir: Path = Field(Path("./data"), description="Directory for the embedded database and secrets.")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL. Default: sqlite+aiosqlite:///<data_dir>/flowyard.db. "
        "PostgreSQL: postgresql+asyncpg://user@host/db.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the HTTP server binds to.")
    log_level: str = Field("info", description="Python log level of the service.")

    # -- first start and authentication ------------------------------------
    admin_username: str | None = Field(None, description="First administrator, created when no user exists.")
    admin_password: SecretStr | None = Field(None, description="Password of the first administrator.")
    secret_key: SecretStr | None = Field(
        None,
        description="Fernet key that encrypts stored secrets; default: <data_dir>/secret.key, created once. "
        "All processes of a deployment need the same key.",
    )
    auth_cache_seconds: float = Field(
        2.0,
        ge=0,
        description="How long a resolved token is reused in a process (0: never). IAM changes "
        "made through a process clear its cache at once; other processes see them within this time.",
    )
    session_ttl_seconds: int = Field(
        3 * 3600, ge=60, description="Idle lifetime of a /login token (sliding)."
    )

    # -- HTTP limits -------------------------------------------------------
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="Largest accepted request body.")

    # -- engine --------------------------------------------------------------
    worker_concurrency: int = Field(64, ge=1, description="Executions one worker runs at once.")
    lease_seconds: float = Field(
        30.0, gt=0, description="How long a claimed execution stays owned without renewal."
    )
    poll_interval: float = Field(0.5, gt=0, description="Worker poll interval when nothing wakes it.")
    scheduler_interval: float = Field(
        1.0, gt=0, description="How often the scheduler looks for due cron ticks."
    )
    lifecycle_timeout: float = Field(30.0, gt=0, description="Bound on starting/stopping moves (seconds).")
    stop_grace_seconds: float = Field(
        30.0, ge=0, description="How long executions of a stopping flow may finish."
    )
    step_timeout: float = Field(60.0, gt=0, description="Timeout of one component call (seconds).")
    max_messages: int = Field(10_000, ge=1, description="Messages one execution may produce in all.")
    max_attempts: int = Field(
        5, ge=1, description="Runs of an execution before a crash-looping one is failed."
    )
    cron_overlap: Literal["skip", "allow"] = Field(
        "skip",
        description="A tick that finds the flow's previous run unfinished is skipped (skip) or run (allow).",
    )
    retention_days: float = Field(14.0, gt=0, description="Age after which executions and logs are pruned.")
    prune_interval: float = Field(300.0, gt=0, description="Seconds between pruning passes.")
    prune_batch: int = Field(2000, ge=1, description="Rows deleted per pruning transaction.")
    runners: int | None = Field(
        None,
        ge=1,
        description="Runner processes per engine process; flow code runs only in them. "
        "Default: one per CPU core.",
    )
    runner_concurrency: int = Field(
        32, ge=1, description="Executions one runner process runs at once (they overlap while awaiting)."
    )
    execution_cpu_seconds: float = Field(
        10.0, gt=0, description="CPU time one execution may use; past it its runner is killed."
    )
    execution_wall_seconds: float = Field(
        300.0,
        gt=0,
        description="Wall time one execution may take; past it the execution fails "
        "(and a runner that does not answer is killed).",
    )
    runner_memory_mb: int = Field(
        256,
        ge=64,
        description="Resident memory of one runner process (MiB); past it the runner is killed "
        "and the execution running at that moment fails.",
    )
    runner_nice: int = Field(
        5, ge=0, le=19, description="Scheduling niceness of runner processes, so the API stays responsive."
    )
    http_allow_link_local: bool = Field(
        False, description="Let the http component reach 169.254.0.0/16 and fd00:ec2::254 (cloud metadata)."
    )
    webhook_group_commit_ms: float = Field(
        2.0, ge=0, description="How long a webhook insert waits to share one commit with concurrent ones."
    )

    def runner_count(self) -> int:
        return self.runners or os.cpu_count() or 1

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'flowyard.db').resolve()}"
