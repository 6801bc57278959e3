"""Failing well (SPEC §11): the retry policy of a node, and the errors a component raises.

A component reports a failure by raising :class:`ComponentError` (its text goes into the logs).
It says whether running the step again could help with ``retryable`` (default True: the far
side may come back) and, when the far side said how long to wait (``Retry-After``), with
``retry_after`` in seconds. :class:`NonRetryable` is a ComponentError that is not retryable
(bad fields, a 4xx answer, a refused address): its step fails at once, whatever the node's
retry policy. Pure: no database, no network (components/ sits below flows/).
"""

from __future__ import annotations

import email.utils
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "RETRY_KEYS",
    "CallFlow",
    "ComponentError",
    "NonRetryable",
    "Park",
    "RetryPolicy",
    "parse_retry_after",
    "validate_retry",
]


class ComponentError(Exception):
    """A step failed for a reason its author can state; the text goes into the logs.

    ``retryable``: whether another attempt may succeed (default True). ``retry_after``: the
    seconds the far side asked to wait (an HTTP ``Retry-After``), or None."""

    def __init__(self, message: str, *, retryable: bool = True, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class NonRetryable(ComponentError):
    """A failure no retry can mend: the step fails at once."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Park(Exception):
    """Raised by a component that wants its execution to wait ``seconds`` durably (``delay``):
    the runner parks the execution and, when it is resumed, calls the component again with
    ``ctx.resumed`` True for the same message."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"park for {seconds:g} s")
        self.seconds = seconds


class CallFlow(Park):
    """Raised by the ``flow`` component (a sub-flow, SPEC §12): its execution parks while an
    execution of ``flow_id`` runs with the message data as trigger data; the queue starts that
    child when it records the park and resumes the parent when the child finishes (or at
    ``timeout`` seconds), calling the component again with ``ctx.resumed`` True and
    ``ctx.child`` the child's outcome (None: it did not finish in time)."""

    def __init__(self, flow_id: str, timeout: float) -> None:
        super().__init__(timeout)
        self.flow_id = flow_id
        self.timeout = timeout


RETRY_KEYS = frozenset({"maxAttempts", "initialInterval", "backoff", "maxInterval", "jitter"})
_MAX_ATTEMPTS = 20
_MAX_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """``node.retry`` (SPEC §11). ``max_attempts`` 1: no retry."""

    max_attempts: int = 1
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 300.0
    jitter: float = 0.1

    @classmethod
    def of(cls, raw: Any) -> RetryPolicy:
        """The policy of a node's ``retry`` object (validated on save); None/absent: no retry."""
        if not isinstance(raw, dict):
            return cls()
        return cls(
            max_attempts=int(raw.get("maxAttempts", 1)),
            initial_interval=float(raw.get("initialInterval", 1.0)),
            backoff=float(raw.get("backoff", 2.0)),
            max_interval=float(raw.get("maxInterval", 300.0)),
            jitter=float(raw.get("jitter", 0.1)),
        )

    def base_interval(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (1-based), before jitter:
        ``min(maxInterval, initialInterval x backoff^(attempt-1))``."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.initial_interval * math.pow(self.backoff, exponent)
        except OverflowError:
            raw = math.inf
        return min(self.max_interval, raw)

    def interval(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """The wait before the next attempt, spread by ± jitter. A ``retry_after`` the far side
        asked for is honoured when it is within ``maxInterval`` (never shortened by jitter)."""
        base = self.base_interval(attempt)
        spread = base * self.jitter
        wait = base + (rng or random).uniform(-spread, spread) if spread else base
        wait = max(0.0, wait)
        if retry_after is not None and 0 <= retry_after <= self.max_interval:
            wait = max(wait, retry_after)
        return wait


def validate_retry(raw: Any) -> list[tuple[str, str]]:
    """Problems of a node's ``retry`` object: (sub-path, message) pairs, empty when valid."""
    if not isinstance(raw, dict):
        return [("", "must be an object (maxAttempts, initialInterval, backoff, maxInterval, jitter)")]
    problems: list[tuple[str, str]] = []
    for key in raw:
        if key not in RETRY_KEYS:
            problems.append(
                (
                    f".{key}",
                    "is not a known field (maxAttempts, initialInterval, backoff, maxInterval, jitter)",
                )
            )

    def number(key: str) -> float | None:
        if key not in raw:
            return None
        value = raw[key]  # null is refused like any other non-number (the schema says so)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append((f".{key}", "must be a number"))
            return None
        return float(value)

    attempts = raw.get("maxAttempts")
    if "maxAttempts" in raw and (
        isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= _MAX_ATTEMPTS
    ):
        problems.append((".maxAttempts", f"must be an integer from 1 to {_MAX_ATTEMPTS}"))
    initial = number("initialInterval")
    if initial is not None and not 0 <= initial <= _MAX_SECONDS:
        problems.append((".initialInterval", f"must be from 0 to {_MAX_SECONDS:g} seconds"))
    backoff = number("backoff")
    if backoff is not None and not 1 <= backoff <= 100:
        problems.append((".backoff", "must be from 1 to 100"))
    maximum = number("maxInterval")
    if maximum is not None and not 0 <= maximum <= _MAX_SECONDS:
        problems.append((".maxInterval", f"must be from 0 to {_MAX_SECONDS:g} seconds"))
    jitter = number("jitter")
    if jitter is not None and not 0 <= jitter <= 1:
        problems.append((".jitter", "must be from 0 to 1"))
    return problems


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from an HTTP ``Retry-After`` (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
