"""Domain errors. Services raise these; only the API layer knows HTTP.

Each class's ``status`` is the HTTP status the API maps it to, and its
docstring the default message.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    message: str
    field: str | None = None


def error_body(status: int, problems: Iterable[Problem]) -> dict[str, Any]:
    """The one error shape: ``{"errors": [{"message", "code", "field"?}]}``."""
    return {
        "errors": [
            {"message": p.message, "code": status, **({"field": p.field} if p.field else {})}
            for p in problems
        ]
    }


class FlowyardError(Exception):
    """Unexpected error."""

    status = 500

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.field = field
        super().__init__(self.message)

    @property
    def problems(self) -> list[Problem]:
        return [Problem(self.message, self.field)]

    @property
    def headers(self) -> dict[str, str]:
        """Response headers that go with this error (e.g. Retry-After)."""
        return {}


class InvalidInput(FlowyardError):
    """Invalid input."""

    status = 400

    def __init__(self, problems: list[Problem] | str, *, field: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [Problem(problems, field)]
        self._problems = problems
        super().__init__("; ".join(p.message for p in problems) or None)

    @property
    def problems(self) -> list[Problem]:
        return self._problems


class Unauthorized(FlowyardError):
    """Missing, invalid or expired token."""

    status = 401


class Forbidden(FlowyardError):
    """You lack the permission this operation needs."""

    status = 403


class NotFound(FlowyardError):
    """Not found."""

    status = 404


class Conflict(FlowyardError):
    """The request conflicts with the current state."""

    status = 409

    def __init__(
        self, message: str | None = None, *, field: str | None = None, problems: list[Problem] | None = None
    ) -> None:
        super().__init__(
            message or ("; ".join(p.message for p in problems) if problems else None), field=field
        )
        self._problems = problems

    @property
    def problems(self) -> list[Problem]:
        """Every reason, when there are several (a flow that cannot start names each)."""
        return self._problems or [Problem(self.message, self.field)]


class PayloadTooLarge(FlowyardError):
    """Request body too large."""

    status = 413


class UnsupportedMediaType(FlowyardError):
    """Content-Type must be application/json."""

    status = 415


class TooManyRequests(FlowyardError):
    """Too many requests; retry later."""

    status = 429

    def __init__(self, message: str | None = None, *, retry_after: int) -> None:
        self.retry_after = max(1, retry_after)
        super().__init__(message)

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ShuttingDown(FlowyardError):
    """The service is shutting down; try again shortly."""

    status = 503
    retry_after = 5  # seconds: by then a load balancer took the process out, or it is back

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class StorageUnavailable(FlowyardError):
    """Storage is unavailable; try again."""

    status = 503
