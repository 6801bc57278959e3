"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter

from flowyard.api.deps import DB
from flowyard.api.responses import JSONOut

router = APIRouter(tags=["health"])


@router.get("/health", summary="Liveness: the process answers")
async def health() -> JSONOut:
    return JSONOut({"status": "ok"})


@router.get(
    "/health/ready",
    summary="Readiness: the database is reachable",
    responses={503: {"description": "Database unreachable"}},
)
async def ready(db: DB) -> JSONOut:
    if await db.ping():
        return JSONOut({"status": "ready", "database": "ok"})
    return JSONOut({"status": "unavailable", "database": "unreachable"}, status_code=503)
