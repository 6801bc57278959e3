"""The retry policy (SPEC §11): intervals, jitter, Retry-After, validation."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from flowyard.components.retry import (
    ComponentError,
    NonRetryable,
    RetryPolicy,
    parse_retry_after,
    validate_retry,
)


def test_backoff_grows_to_the_maximum() -> None:
    p = RetryPolicy.of({"maxAttempts": 6, "initialInterval": 1, "backoff": 3, "maxInterval": 20, "jitter": 0})
    assert [p.interval(n) for n in range(1, 6)] == [1, 3, 9, 20, 20]
    assert RetryPolicy.of(None) == RetryPolicy() and RetryPolicy().max_attempts == 1
    huge = RetryPolicy(initial_interval=1, backoff=100, max_interval=300)
    assert huge.base_interval(10_000) == 300  # no overflow


def test_jitter_spreads_within_its_fraction() -> None:
    p = RetryPolicy(initial_interval=10, backoff=1, jitter=0.2)
    rng = random.Random(7)
    waits = [p.interval(1, rng=rng) for _ in range(200)]
    assert all(8 <= w <= 12 for w in waits)
    assert len(set(waits)) > 100  # spread, not a constant


def test_retry_after_is_honoured_within_the_maximum() -> None:
    p = RetryPolicy(initial_interval=1, max_interval=30, jitter=0)
    assert p.interval(1, retry_after=12) == 12
    assert p.interval(1, retry_after=0.5) == 1  # never shorter than the backoff
    assert p.interval(1, retry_after=3600) == 1  # beyond maxInterval: not honoured


def test_parse_retry_after() -> None:
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    assert parse_retry_after("120") == 120
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now=now) == 90
    assert parse_retry_after(format_datetime(now - timedelta(seconds=90), usegmt=True), now=now) == 0
    for bad in (None, "", "soon", "-5", "1.5e3"):
        assert parse_retry_after(bad) is None


def test_validation_names_each_problem() -> None:
    assert (
        validate_retry(
            {"maxAttempts": 3, "initialInterval": 0.5, "backoff": 1, "maxInterval": 60, "jitter": 0}
        )
        == []
    )
    assert validate_retry({}) == []
    problems = dict(
        validate_retry(
            {
                "maxAttempts": 21,
                "initialInterval": -1,
                "backoff": 0.5,
                "maxInterval": "x",
                "jitter": 1.5,
                "x": 1,
            }
        )
    )
    assert set(problems) == {".maxAttempts", ".initialInterval", ".backoff", ".maxInterval", ".jitter", ".x"}
    assert dict(validate_retry({"maxAttempts": True})).keys() == {".maxAttempts"}
    assert dict(validate_retry({"maxAttempts": 2.0})).keys() == {".maxAttempts"}
    assert validate_retry([1])[0][0] == ""


def test_errors_say_whether_to_retry() -> None:
    assert ComponentError("x").retryable and ComponentError("x").retry_after is None
    assert not ComponentError("x", retryable=False).retryable
    assert ComponentError("x", retry_after=5).retry_after == 5
    assert not NonRetryable("x").retryable and isinstance(NonRetryable("x"), ComponentError)
