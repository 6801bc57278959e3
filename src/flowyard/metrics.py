"""Prometheus metrics: every instrument of the service, and who may read them.

All instrumentation goes through the functions of this module (one line at each call
site), so metric names, label sets and their bounds are decided here only. Label values
are bounded: route templates (never raw paths), outcomes, statuses and triggers from
fixed sets; never flow, execution, tenant or user ids.

Processes. ``flowyard serve`` with several processes points ``PROMETHEUS_MULTIPROC_DIR``
at a private directory it creates for the run (``multiproc_dir``); every child writes its
samples there (prometheus-client's multiprocess mode, memory-mapped files) and any API
process answers ``GET /metrics`` with the sum of all of them. A single-process ``serve``
and a standalone ``flowyard worker`` keep their metrics in memory; the worker answers
them on its own listener (``FLOWYARD_METRICS_PORT``, see ``serve_metrics``).

The metrics are built on first use, not at import: prometheus-client decides between
in-memory and multiprocess values when it is imported, and ``serve`` sets the directory
before anything records.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"
# Seconds: HTTP requests and commits are mostly milliseconds; executions up to minutes.
_HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_EXEC_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

WEBHOOK_OUTCOMES = {
    400: "invalid",
    401: "signature",
    403: "signature",
    404: "unknown_flow",
    409: "conflict",
    413: "too_large",
    415: "media_type",
    429: "rate_limited",
    503: "unavailable",
}


class _Instruments:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()  # *_created series: noise for counters that start with the process

        def c(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Counter(f"flowyard_{name}", doc, labels)

        self.http_requests = c("http_requests", "HTTP requests answered.", ("method", "route", "status"))
        self.http_duration = Histogram(
            "flowyard_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            ("method", "route"),
            buckets=_HTTP_BUCKETS,
        )
        self.webhooks = c("webhooks", "Webhook requests, accepted or refused by reason.", ("outcome",))
        self.started = c("executions_started", "Executions claimed and started.", ("trigger",))
        self.finished = c("executions_finished", "Executions finished (recorded).", ("trigger", "status"))
        self.exec_duration = Histogram(
            "flowyard_execution_duration_seconds",
            "Run time of finished executions.",
            ("trigger",),
            buckets=_EXEC_BUCKETS,
        )
        self.lease_expiries = c(
            "lease_expiries", "Executions re-queued because their worker died (heartbeat or lease)."
        )
        self.held_back = c(
            "claims_held_back",
            "Queue groups (tenants, or owners of tenantless flows) whose queued executions a claim "
            "passed over because they ran FLOWYARD_MAX_RUNNING_PER_TENANT already.",
        )
        self.reruns = c("execution_reruns", "Executions re-run on another runner after theirs died.")
        self.cron_ticks = c("cron_ticks", "Cron ticks fired or skipped (overlap).", ("outcome",))
        self.lifecycle_moves = c("lifecycle_moves", "Flows moved out of starting/stopping.", ("to",))
        self.lifecycle_fallbacks = c(
            "lifecycle_fallbacks", "Flows forced inactive after a move failed past its bound."
        )
        self.runners_alive = Gauge(
            "flowyard_runners_alive", "Runner processes ready for work.", multiprocess_mode="livesum"
        )
        self.poison = c(
            "poison_items",
            'Items that failed alone on a batch path (docs/engine.md "One bad item fails alone").',
            ("path",),
        )
        self.runner_kills = c("runner_kills", "Runner processes killed or dead, by reason.", ("reason",))
        self.commit_duration = Histogram(
            "flowyard_db_commit_duration_seconds",
            "Time of a write transaction's commit.",
            buckets=_COMMIT_BUCKETS,
        )
        # Children of labelled metrics, by label values: .labels() takes a lock and builds a
        # key on every call; the hot path looks its child up here instead.
        self.children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        found = self.children.get(key)
        if found is None:
            found = self.children[key] = metric.labels(*values)
        return found


_instruments: _Instruments | None = None


def _m() -> _Instruments:
    global _instruments
    if _instruments is None:
        _instruments = _Instruments()
    return _instruments


# -- instrumentation: one call at each site ------------------------------------------


def http_request(method: str, route: str, status: int, seconds: float) -> None:
    m = _m()
    if method not in _METHODS:
        method = "other"
    m.child(m.http_requests, method, route, str(status)).inc()
    m.child(m.http_duration, method, route).observe(seconds)


def webhook(status: int | None) -> None:
    """A webhook request was answered: ``None`` when it was accepted (stored; whatever the
    flow replied later), else the status of its refusal, counted by reason."""
    if status is None:
        outcome = "accepted"
    elif status >= 500 and status != 503:
        outcome = "error"
    else:
        outcome = WEBHOOK_OUTCOMES.get(status, "invalid")
    m = _m()
    m.child(m.webhooks, outcome).inc()


def _trigger(trigger: str | None) -> str:
    return trigger if trigger in ("webhook", "cron", "manual") else "other"


def executions_started(triggers: list[str]) -> None:
    m = _m()
    for t in triggers:
        m.child(m.started, _trigger(t)).inc()


def execution_finished(trigger: str | None, status: str, seconds: float | None) -> None:
    m = _m()
    t = _trigger(trigger)
    st = status if status in ("succeeded", "failed", "cancelled") else "other"
    m.child(m.finished, t, st).inc()
    if seconds is not None and seconds >= 0:
        m.child(m.exec_duration, t).observe(seconds)


def lease_expiries(n: int) -> None:
    if n:
        _m().lease_expiries.inc(n)


def claims_held_back(groups: int) -> None:
    if groups:
        _m().held_back.inc(groups)


def execution_rerun() -> None:
    _m().reruns.inc()


def cron_tick(fired: bool) -> None:
    m = _m()
    m.child(m.cron_ticks, "fired" if fired else "skipped").inc()


def lifecycle_move(to: str) -> None:
    m = _m()
    m.child(m.lifecycle_moves, to if to in ("active", "inactive") else "other").inc()


def lifecycle_fallback() -> None:
    _m().lifecycle_fallbacks.inc()


def runner_alive(delta: int) -> None:
    _m().runners_alive.inc(delta)


def runner_killed(reason: str) -> None:
    """``reason``: cpu, memory, wall, or crash (any other death of a runner)."""
    m = _m()
    m.child(m.runner_kills, reason if reason in ("cpu", "memory", "wall") else "crash").inc()


POISON_PATHS = frozenset({"webhook", "claim", "dispatch", "outcome", "trigger", "prune", "count"})


def poison(path: str) -> None:
    """An item of a batch path failed alone (``isolate.py``): ``path`` says which."""
    m = _m()
    m.child(m.poison, path if path in POISON_PATHS else "other").inc()


def db_commit(seconds: float) -> None:
    _m().commit_duration.observe(seconds)


# -- processes ------------------------------------------------------------------------


def multiproc_dir() -> str:
    """``serve`` with several processes: a fresh private directory for this run's samples,
    in the environment its children inherit. Call before anything records."""
    path = tempfile.mkdtemp(prefix="flowyard-metrics-")
    os.environ[ENV_DIR] = path
    return path


def remove_multiproc_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path)


def process_dead(pid: int) -> None:
    """A child of ``serve`` exited: its live gauges (runners alive) stop counting."""
    if os.environ.get(ENV_DIR):
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(pid)


# -- exposition ----------------------------------------------------------------------


QueueReader = Callable[[], Awaitable[tuple[dict[str, int], float]]]


class QueueGauges:
    """Queue depth and the age of the oldest queued execution, read from the database at
    scrape time and reused for ``ttl`` seconds (every scrape of every API process would
    otherwise query; the figures are seconds-old anyway)."""

    def __init__(self, read: QueueReader, ttl: float = 2.0) -> None:
        self.read = read
        self.ttl = ttl
        self._at = -1e9
        self._value: tuple[dict[str, int], float] | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> tuple[dict[str, int], float] | None:
        async with self._lock:
            if self._value is None or time.monotonic() - self._at > self.ttl:
                try:
                    self._value = await self.read()
                except Exception:
                    log.warning("reading the queue gauges failed", exc_info=True)
                    return None
                self._at = time.monotonic()
            return self._value


def exposition(queue: tuple[dict[str, int], float] | None = None) -> bytes:
    """The text format: every process's samples (multiprocess mode) or this one's, plus the
    queue gauges when given."""
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    _m()  # families exist (at zero) before anything happened
    path = os.environ.get(ENV_DIR)
    if path:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
    else:
        registry = REGISTRY
    out = generate_latest(registry)
    if queue is not None:
        depth, oldest = queue
        extra = CollectorRegistry()

        class _Queue:
            def collect(self) -> Any:
                g = GaugeMetricFamily(
                    "flowyard_queue_executions", "Executions not finished, by status.", labels=["state"]
                )
                for state in ("queued", "running", "waiting"):
                    g.add_metric([state], depth.get(state, 0))
                yield g
                yield GaugeMetricFamily(
                    "flowyard_queue_oldest_queued_age_seconds",
                    "Age of the oldest queued execution (0: none queued).",
                    value=oldest,
                )

        extra.register(_Queue())
        out += generate_latest(extra)
    return out


# -- who may read them ----------------------------------------------------------------


def allowed(client_host: str | None, authorization: str | None, token: str | None) -> bool:
    """The one rule for reading metrics. No token configured: loopback clients only.
    A token configured: ``Authorization: Bearer <token>``, compared in constant time,
    from any address."""
    if token:
        if not authorization:
            return False
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), token.encode())
    if not client_host:
        return False
    try:
        return ipaddress.ip_address(client_host).is_loopback
    except ValueError:
        return False


# -- a standalone worker's listener ---------------------------------------------------

_MAX_HEAD = 8192


async def serve_metrics(host: str, port: int, token: str | None) -> asyncio.Server:
    """``flowyard worker`` with ``FLOWYARD_METRICS_PORT``: a minimal HTTP/1.0 listener that
    answers ``GET /metrics`` (same access rule as the API's) and nothing else."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        auth = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "authorization":
                auth = value.strip()
        peer = writer.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) and peer else None
        if len(parts) != 3 or parts[0] != "GET" or parts[1].split("?")[0] != "/metrics":
            status, body, ctype = "404 Not Found", b"not found\n", "text/plain"
        elif not allowed(client, auth, token):
            status, body, ctype = "403 Forbidden", b"forbidden\n", "text/plain"
        else:
            status, body, ctype = "200 OK", exposition(), CONTENT_TYPE
        writer.write(
            f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, host, port, limit=_MAX_HEAD)
