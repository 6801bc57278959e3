"""Settings, read once from ``FLOWYARD_*`` environment variables and passed down.

Nothing reads the environment at import time: the CLI and the app factory build a
``Settings`` and hand it to whatever needs it, and tests build their own.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    # populate_by_name: fields with an environment alias (http_allow_networks) still take their name.
    model_config = SettingsConfigDict(env_prefix="FLOWYARD_", extra="ignore", populate_by_name=True)

    # -- where things live -------------------------------------------------
    data_dir: Path = Field(Path("./data"), description="Directory for the embedded database and secrets.")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL. Default: sqlite+aiosqlite:///<data_dir>/flowyard.db. "
        "PostgreSQL: postgresql+asyncpg://user@host/db.",
    )
    database_pgbouncer: bool = Field(
        False,
        description="PostgreSQL only: FLOWYARD_DATABASE_URL points at PgBouncer in transaction mode "
        "(the same as the URL option ?pgbouncer=true): no prepared-statement caches, so no state "
        "outlives a transaction. Set FLOWYARD_NOTIFY_DATABASE_URL to a direct connection for LISTEN.",
    )
    sqlite_direct: bool = Field(
        True,
        description="SQLite only: run each hot transaction (accept a batch of webhooks, claim, record "
        "outcomes) whole on the database's own thread, one thread hop per transaction instead of one "
        "per statement (docs/performance.md). false: through the pooled connections like every "
        "other transaction; for comparison only.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the HTTP server binds to.")
    log_level: str = Field("info", description="Python log level of the service.")
    log_format: Literal["json", "text"] | None = Field(
        None,
        description="json: one JSON object per line (time, level, logger, message, requestId and, "
        "where known, flowId, executionId, tenant); text: plain lines. Default: text when stderr "
        "is a terminal, else json.",
    )
    access_log: bool = Field(
        False, description="Log one line per HTTP request (uvicorn's access log, in FLOWYARD_LOG_FORMAT)."
    )
    metrics_token: SecretStr | None = Field(
        None,
        description="Bearer token GET /metrics requires. Unset: /metrics answers loopback clients only.",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="`flowyard worker` only: serve its own GET /metrics on FLOWYARD_HOST at this port "
        "(unset: no listener). `serve` exposes /metrics on its API port.",
    )

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
    session_max_seconds: int = Field(
        24 * 3600,
        ge=60,
        description="Absolute lifetime of a /login token: it never slides past this long after login.",
    )
    login_max_failures: int = Field(
        5,
        ge=0,
        description="Failed login attempts per username within FLOWYARD_LOGIN_WINDOW_SECONDS before further "
        "ones get 429 until the window ends (0: no limit). Counted alike for unknown usernames.",
    )
    login_max_failures_per_address: int = Field(
        50,
        ge=0,
        description="Failed login attempts per client address (any usernames) within the window before "
        "further ones get 429 (0: no limit). The address is the TCP peer, or X-Forwarded-For "
        "from a proxy listed in uvicorn's FORWARDED_ALLOW_IPS.",
    )
    login_window_seconds: int = Field(
        15 * 60,
        ge=1,
        description="Length of the login throttling window; a throttled username or address may "
        "try again when its window ends (the 429 carries Retry-After).",
    )

    # -- HTTP limits -------------------------------------------------------
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="Largest accepted request body.")
    http_max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Largest request head (request line and all header lines); a larger one is "
        "answered 431 and the connection closed. nginx's large_client_header_buffers 4 x 8k.",
    )
    http_max_headers: int = Field(
        100,
        ge=1,
        description="Most header fields in one request; more are answered 431 and the connection "
        "closed. Apache's LimitRequestFields.",
    )
    http_header_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a client has to send the whole request head, counted from the connection "
        "(or from the first byte of a later request on it); then 408, or a silent close when nothing "
        "came. nginx's client_header_timeout.",
    )
    http_body_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds the request body may stall between two reads; then 408 and the "
        "connection closed. nginx's client_body_timeout.",
    )
    http_keepalive_timeout: float = Field(
        75.0,
        gt=0,
        description="Seconds an idle keep-alive connection stays open after a response. nginx's "
        "keepalive_timeout; longer than the 60 s upstream idle timeouts of common proxies, so "
        "a proxy never reuses a connection the server is closing.",
    )
    api_processes: int | None = Field(
        None,
        ge=1,
        description="API processes `flowyard serve` runs on its one listening socket, beside one "
        "engine process. Default: one per CPU core but one (the engine and its runners keep a core). "
        "1: API and engine in a single process.",
    )
    wait_poll_interval: float = Field(
        1.0,
        gt=0,
        description="How often a `?wait=` webhook re-reads its execution when no completion notice came "
        "(a backstop: the notice normally answers it).",
    )
    notify_database_url: str | None = Field(
        None,
        description="PostgreSQL only: a direct connection URL for the LISTEN connection when "
        "FLOWYARD_DATABASE_URL points at PgBouncer in transaction mode. Default: FLOWYARD_DATABASE_URL.",
    )

    # -- engine --------------------------------------------------------------
    worker_concurrency: int = Field(64, ge=1, description="Executions one worker runs at once.")
    max_running_per_tenant: int | None = Field(
        None,
        ge=0,
        description="Executions of one tenant (of one owner, for tenantless flows) running at once, "
        "counted in the database across every engine process; a claim passes over a tenant at its "
        "cap, so one tenant never holds every slot. Default: half of one engine's slots "
        "(min(FLOWYARD_WORKER_CONCURRENCY, FLOWYARD_RUNNERS x FLOWYARD_RUNNER_CONCURRENCY) / 2), "
        "at least 1. 0: no cap.",
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        description="How long a claimed execution stays owned without renewal; also the event-trigger "
        "lease of a flow.",
    )
    poll_interval: float = Field(
        2.0,
        gt=0,
        description="Worker poll interval when nothing wakes it: a backstop, as enqueues wake workers "
        "through the notification channel.",
    )
    scheduler_interval: float = Field(
        1.0, gt=0, description="How often the scheduler looks for due cron ticks."
    )
    lifecycle_timeout: float = Field(30.0, gt=0, description="Bound on starting/stopping moves (seconds).")
    stop_grace_seconds: float = Field(
        30.0,
        ge=0,
        description="How long running executions may finish when their flow stops or the "
        "process shuts down (SIGTERM/SIGINT).",
    )
    heartbeat_seconds: float = Field(
        1.0, gt=0, description="How often an engine process renews its heartbeat row."
    )
    heartbeat_timeout_seconds: float = Field(
        3.0,
        gt=0,
        description="A process whose heartbeat is older than this is dead: another process releases "
        "its executions at once (the lease stays the backstop).",
    )
    serve_lock: bool = Field(
        True,
        description="`serve` with its engine on SQLite holds <database>.serve-lock, so a second one on "
        "the same database refuses to start (the embedded shape runs one serve per data directory). "
        "False lets several serve on one SQLite file (tests of engine takeover do).",
    )
    drain_seconds: float = Field(
        1.0,
        ge=0,
        description="On SIGTERM/SIGINT, how long an API process keeps answering (with /health/ready "
        "at 503) before it stops accepting, so a load balancer takes it out first.",
    )
    step_timeout: float = Field(60.0, gt=0, description="Timeout of one component call (seconds).")
    delay_park_seconds: float = Field(
        1.0,
        ge=0,
        description="A wait (a delay step, or the interval before a step's next attempt) longer than "
        "this parks the execution durably (status waiting): it holds no runner, slot, transaction or "
        "lease until it is due. Shorter waits are slept in the runner.",
    )
    resume_poll_seconds: float = Field(
        5.0,
        gt=0,
        description="How often each engine looks for waiting executions that are due (it also wakes "
        "at the next due time it knows of).",
    )
    max_messages: int = Field(10_000, ge=1, description="Messages one execution may produce in all.")
    max_output_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest message (data and metadata, as JSON) a step may emit; over it the step "
        "fails. Above FLOWYARD_HTTP_MAX_RESPONSE_BYTES and FLOWYARD_CONNECTOR_MAX_RESULT_BYTES, so "
        "a response those let in fits.",
    )
    max_result_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest value stored or returned as an execution's result (as JSON): the body of "
        "a respond node's reply (the ?wait= reply), the output of a last step, the data of a log "
        "entry (cut to a marker over it). Over it the step that produced it fails.",
    )
    flow_max_depth: int = Field(
        5,
        ge=1,
        le=50,
        description="How deeply `flow` steps (sub-flows, SPEC §12) may nest: a flow's execution "
        "starting a child, that child starting another... A step that would nest deeper fails.",
    )
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
    runners_warm: int = Field(
        1,
        ge=1,
        description="Runner processes started with the engine and kept running; the others (up to "
        "FLOWYARD_RUNNERS) start when a tenant needs a runner or a tenant's work is CPU-bound, and stop "
        "after FLOWYARD_RUNNER_SURGE_IDLE_SECONDS idle.",
    )
    runner_concurrency: int = Field(
        32, ge=1, description="Executions one runner process runs at once (they overlap while awaiting)."
    )
    runner_surge: int = Field(
        2,
        ge=0,
        description="Extra runner processes an engine may start when a tenant needs a runner and every "
        "runner holds another tenant's executions (tenants never share a runner).",
    )
    runner_surge_idle_seconds: float = Field(
        30.0,
        gt=0,
        description="Seconds a runner started on demand (a surge runner, or a runner beyond "
        "FLOWYARD_RUNNERS_WARM) may stay idle before it is stopped.",
    )
    runner_quarantine_seconds: float = Field(
        10.0,
        ge=0,
        description="After a runner of a tenant died with several executions aboard, that tenant's next "
        "executions run alone, one per runner, for this many seconds (0: no quarantine).",
    )
    runner_penalty_seconds: float = Field(
        30.0,
        ge=0,
        description="After a tenant's execution killed a runner (a limit crossed, or a death with several "
        "aboard), that tenant runs on one runner at a time, demoted (FLOWYARD_RUNNER_DEMOTE_NICE), for "
        "this many seconds while another tenant has work, renewed by each death (0: no penalty).",
    )
    runner_linger_seconds: float = Field(
        1.0,
        ge=0,
        description="Seconds a runner that emptied stays kept for its tenant before another tenant may "
        "take it (a tenant without a runner of its own, not charged with a runner death, may take it "
        "at once); 0: offered to all at once.",
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
    code_cpu_seconds: float = Field(
        2.0,
        gt=0,
        description="CPU time one run of a code step may use (seconds); past it the step fails "
        "alone. Keep it below FLOWYARD_EXECUTION_CPU_SECONDS, which kills the whole runner.",
    )
    code_memory_mb: int = Field(
        64,
        ge=1,
        description="Memory one run of a code step may allocate in its JavaScript runtime (MiB); "
        "past it the step fails alone. Keep it well below FLOWYARD_RUNNER_MEMORY_MB.",
    )
    runner_nice: int = Field(
        5, ge=0, le=19, description="Scheduling niceness of runner processes, so the API stays responsive."
    )
    runner_demote_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="While several tenants have work, each tenant's runners beyond its first run this much "
        "nicer (lower CPU priority), so one tenant's CPU-bound work cannot slow another's; 0 turns it off.",
    )
    http_allow_networks: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        # One outbound policy for all flow code (http and the connectors); the old name still works.
        validation_alias=AliasChoices("FLOWYARD_OUTBOUND_ALLOW_NETWORKS", "FLOWYARD_HTTP_ALLOW_NETWORKS"),
        description="CIDRs flow code (http and the connector components) may reach although the network "
        "policy denies them by default (loopback, private, link-local, CGNAT, unique-local, multicast, "
        "metadata...). Comma-separated or a JSON list, e.g. 10.1.0.0/16,fd12::/48. "
        "FLOWYARD_OUTBOUND_ALLOW_NETWORKS; FLOWYARD_HTTP_ALLOW_NETWORKS is the older name.",
    )
    connector_idle_seconds: float = Field(
        60.0,
        gt=0,
        description="A connector's connection pool (sql, amqp, redis) unused this long is closed.",
    )
    connector_max_result_bytes: int = Field(
        5 * 1024 * 1024,
        ge=1024,
        description="Largest result a connector step emits (sql rows, a redis value), as JSON.",
    )
    max_trigger_payload_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest message an event trigger (amqp consume, mqtt subscribe, redis xread) turns "
        "into an execution, checked before the message is read whole where the protocol allows; a "
        "larger one is refused alone: logged, counted and dropped (AMQP: rejected, so it is "
        "dead-lettered if the queue has a dead-letter exchange). Like FLOWYARD_MAX_BODY_BYTES for "
        "webhooks.",
    )
    sql_sqlite_dir: Path | None = Field(
        None,
        description="Directory under which the sql component may open SQLite files named by a "
        "credential (unset: SQLite credentials are refused, so flows cannot open the service's files).",
    )
    http_max_response_bytes: int = Field(
        5 * 1024 * 1024, ge=1024, description="Largest response body the http component reads (decoded)."
    )
    webhook_group_commit_ms: float = Field(
        2.0, ge=0, description="How long a webhook insert waits to share one commit with concurrent ones."
    )
    webhook_signature_tolerance_seconds: int = Field(
        300,
        ge=1,
        description="How far the t= timestamp of X-Flowyard-Signature may lie in the past or the future.",
    )
    webhook_rate_limit: float = Field(
        5000.0,
        ge=0,
        description="Webhook requests accepted per second per flow, across all API processes (0: no limit). "
        "The default is above what one API process accepts for one flow (docs/security.md), so it "
        "stops a flood without throttling a busy flow; lower it to what a flow's callers need.",
    )
    webhook_rate_burst: int | None = Field(
        None,
        ge=1,
        description="Webhook requests a flow may receive at once before the rate applies "
        "(default: the rate per second, at least 1).",
    )

    @field_validator("http_allow_networks", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return orjson.loads(text)
            return [v.strip() for v in text.split(",") if v.strip()]
        return value

    @field_validator("http_allow_networks")
    @classmethod
    def _valid_networks(cls, value: list[str]) -> list[str]:
        for v in value:
            ipaddress.ip_network(v, strict=False)  # ValueError names the bad entry
        return value

    def webhook_burst(self) -> int:
        return self.webhook_rate_burst or max(1, int(self.webhook_rate_limit))

    def api_process_count(self) -> int:
        # The engine process and its runners need a core of their own; on 2 cores, splitting
        # the API from the engine cost more CPU per webhook than it gained (docs/performance.md).
        return self.api_processes or max(1, (os.cpu_count() or 1) - 1)

    def runner_count(self) -> int:
        return self.runners or os.cpu_count() or 1

    def tenant_running_cap(self) -> int:
        """FLOWYARD_MAX_RUNNING_PER_TENANT, or its default; 0: no cap."""
        if self.max_running_per_tenant is not None:
            return self.max_running_per_tenant
        slots = min(self.worker_concurrency, self.runner_count() * self.runner_concurrency)
        return max(1, slots // 2)

    def configured_secret_key(self) -> str | None:
        """FLOWYARD_SECRET_KEY when set and not empty; else the key file is used (secrets/crypto.py)."""
        return self.secret_key.get_secret_value() or None if self.secret_key else None

    def resolved_database_url(self) -> str:
        if self.database_url:
            if self.database_pgbouncer:
                from sqlalchemy.engine import make_url  # not at import: runners read Settings too

                url = make_url(self.database_url)
                return url.update_query_dict({"pgbouncer": "true"}).render_as_string(hide_password=False)
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'flowyard.db').resolve()}"
