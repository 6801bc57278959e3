"""One error shape everywhere: ``{"errors": [{"message", "code", "field"?}]}``."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from flowyard.api.middleware import request_id_of
from flowyard.api.problems import validation_problems
from flowyard.api.responses import JSONOut as ORJSONResponse
from flowyard.errors import FlowyardError, Problem, error_body

log = logging.getLogger("flowyard.api")

ERROR_SCHEMA = {
    "type": "object",
    "required": ["errors"],
    "properties": {
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["message", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "code": {"type": "integer"},
                    "field": {"type": "string"},
                },
            },
        }
    },
}

_STATUS_TEXT = {
    400: "Invalid request.",
    401: "Missing, invalid or expired token.",
    403: "Forbidden.",
    404: "Not found.",
    405: "Method not allowed.",
    409: "Conflict.",
    413: "Request body too large.",
    415: "Content-Type must be application/json.",
    429: "Too many requests.",
    500: "Internal error.",
    503: "Service unavailable.",
}


def error_response(
    status: int, problems: Sequence[Problem], headers: dict[str, str] | None = None
) -> ORJSONResponse:
    return ORJSONResponse(error_body(status, problems), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(FlowyardError)
    async def _domain(request: Request, exc: FlowyardError) -> ORJSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        headers.update(exc.headers)
        if exc.status >= 500:
            log.error("request %s failed: %s", request_id_of(request.scope), exc.message)
        return error_response(exc.status, exc.problems, headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> ORJSONResponse:
        return error_response(400, validation_problems(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> ORJSONResponse:
        detail = (
            exc.detail if isinstance(exc.detail, str) and exc.detail else _STATUS_TEXT.get(exc.status_code)
        )
        if exc.status_code == 404 and detail == "Not Found":
            detail = "No such endpoint."
        return error_response(exc.status_code, [Problem(detail or "Error.")], dict(exc.headers or {}) or None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> ORJSONResponse:
        rid = request_id_of(request.scope)
        log.exception("request %s failed unexpectedly", rid)
        return error_response(500, [Problem(f"Internal error (request id {rid}).")])
