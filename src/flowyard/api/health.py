"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request

from flowyard.api.deps import DB
from flowyard.api.responses import JSONOut
from flowyard.errors import ShuttingDown

router = APIRouter(tags=["health"])

# Seconds a load balancer should wait before asking a draining process again (it will be gone).
_RETRY_AFTER = ShuttingDown.retry_after


@router.get("/health", summary="Liveness: the process answers")
async def health() -> JSONOut:
    return JSONOut({"status": "ok"})


@router.get(
    "/health/ready",
    summary="Readiness: the database is reachable and the process is not shutting down",
    responses={
        503: {
            "description": "Draining (the process received SIGTERM/SIGINT and is stopping; "
            "see Retry-After) or the database is unreachable",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["status", "database"],
                        "properties": {
                            "status": {"type": "string", "enum": ["draining", "unavailable"]},
                            "database": {"type": "string", "enum": ["unchecked", "unreachable"]},
                        },
                    }
                }
            },
        }
    },
)
async def ready(request: Request, db: DB) -> JSONOut:
    if getattr(request.app.state, "draining", False):
        return JSONOut(
            {"status": "draining", "database": "unchecked"},
            status_code=503,
            headers={"Retry-After": str(_RETRY_AFTER)},
        )
    if await db.ping():
        return JSONOut({"status": "ready", "database": "ok"})
    return JSONOut({"status": "unavailable", "database": "unreachable"}, status_code=503)
