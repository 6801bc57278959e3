"""OpenAPI helpers: documented error responses."""

from __future__ import annotations

from typing import Any

_TEXT = {
    400: "Malformed id, invalid body or invalid query parameter",
    401: "Missing, invalid or expired token",
    403: "Authenticated but lacking a permission",
    404: "Not found, or not visible to the caller",
    409: "State conflict",
    413: "Body too large",
    415: "Content-Type is not JSON",
    429: "Too many requests: retry after the Retry-After header's seconds",
    503: "Storage unavailable",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the given error statuses, in the one error shape."""
    return {
        code: {
            "description": _TEXT.get(code, "Error"),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
        }
        for code in codes
    }
