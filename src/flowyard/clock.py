"""UTC time and the one timestamp format of the API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import PlainSerializer


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def isoformat(value: datetime) -> str:
    """ISO 8601, UTC, milliseconds, ``Z``: ``2026-11-22T10:15:30.123Z``."""
    return as_utc(value).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


Timestamp = Annotated[
    datetime,
    PlainSerializer(isoformat, return_type=str, when_used="json"),
]
