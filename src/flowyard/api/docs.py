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


def _error_entry(code: int) -> dict[str, Any]:
    return errors(code)[code]


def complete(schema: dict[str, Any], *, id_pattern: str) -> None:
    """Rules that hold on every operation, written into the document once (``app`` calls it
    for every route): each ``{id}`` path parameter has the id pattern; every operation may
    answer ``400`` (NUL in the path or query, api/paths.py); every operation with a body may
    answer ``413`` and ``415``. And a ``default: null`` is dropped where null is not allowed
    (PATCH fields that may be omitted but not null)."""
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            for param in op.get("parameters", []):
                if param.get("in") == "path" and param.get("name") == "id":
                    param["schema"] = {**param.get("schema", {}), "type": "string", "pattern": id_pattern}
            responses = op["responses"]
            codes = [400] + ([413, 415] if "requestBody" in op else [])
            for code in codes:
                responses.setdefault(str(code), _error_entry(code))
    _drop_null_defaults(schema.get("components", {}).get("schemas", {}))


def _allows_null(node: dict[str, Any]) -> bool:
    if node.get("type") == "null" or node.get("nullable") is True:
        return True
    return any(isinstance(o, dict) and _allows_null(o) for o in node.get("anyOf", []) + node.get("oneOf", []))


def _drop_null_defaults(node: Any) -> None:
    if isinstance(node, dict):
        if "default" in node and node["default"] is None and not _allows_null(node):
            node.pop("default")
        for value in node.values():
            _drop_null_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _drop_null_defaults(value)
