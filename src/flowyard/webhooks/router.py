"""HTTP for incoming webhooks: ``POST /webhooks/{flowId}``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Header, Path, Query, Request
from pydantic import BaseModel

from flowyard.api.deps import read_json
from flowyard.api.docs import errors
from flowyard.api.responses import JSONOut, Single, single
from flowyard.errors import InvalidInput
from flowyard.executions.models import Execution
from flowyard.webhooks.service import SIGNATURE_HEADER, WebhookRequest

router = APIRouter(tags=["webhooks"])

MAX_WAIT = 60.0
_POLL = 0.2


class WebhookAccepted(BaseModel):
    executionId: str
    flowId: str
    status: str


@router.post(
    "/webhooks/{flowId}",
    status_code=202,
    response_model=Single[WebhookAccepted],
    responses={
        200: {
            "description": "With ?wait=: the reply set by a respond node, or the last message's data",
            "content": {"application/json": {"schema": {}}},
        },
        **errors(400, 401, 404, 409, 413, 415, 503),
        502: {
            "description": "With ?wait=: the execution failed",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
        },
    },
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {}}}}},
    summary="Trigger an execution of an active flow with the posted JSON",
)
async def receive(
    request: Request,
    flowId: Annotated[str, Path(description="Id of an active flow without cron.")],
    wait: Annotated[
        float | None, Query(gt=0, le=MAX_WAIT, description="Seconds to wait for the result.")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=255,
            description="Repeats with the same key within 24 h return the first answer.",
        ),
    ] = None,
    signature: Annotated[
        str | None,
        Header(
            alias="X-Flowyard-Signature",
            description="sha256=<hex HMAC of the body>, required when the flow has a webhookSecret.",
        ),
    ] = None,
) -> JSONOut:
    payload = await read_json(request)
    raw = await request.body()
    state = request.app.state
    hub = state.engine.hub if state.engine is not None else None
    accepted = await state.webhooks.submit(
        WebhookRequest(
            flow_id=flowId,
            payload=payload,
            body_hash=hashlib.sha256(raw).hexdigest(),
            raw=raw,
            idempotency_key=idempotency_key,
            signature=signature or request.headers.get(SIGNATURE_HEADER),
        )
    )
    queued = single(
        {"executionId": accepted.execution_id, "flowId": accepted.flow_id, "status": "queued"}, 202
    )
    if accepted.replayed:
        queued.headers["Idempotent-Replayed"] = "true"
    if wait is None:
        return queued
    if wait <= 0 or wait > MAX_WAIT:
        raise InvalidInput(f"wait must be between 0 and {MAX_WAIT:g} seconds.", field="wait")
    finished = await _wait_for(request, accepted.execution_id, wait, hub)
    if finished is None:
        return queued
    status, result, error = finished
    if status == "succeeded":
        result = result or {}
        if "reply" in result:
            reply = result["reply"]
            return JSONOut(
                reply.get("body"),
                status_code=int(reply.get("status", 200)),
                headers={str(k): str(v) for k, v in (reply.get("headers") or {}).items()},
            )
        return JSONOut(result.get("data"))
    return JSONOut(
        {
            "errors": [
                {
                    "message": f"Execution {accepted.execution_id} {status}: {error or 'no reason given'}",
                    "code": 502,
                }
            ]
        },
        status_code=502,
    )


async def _wait_for(
    request: Request, execution_id: str, seconds: float, hub: Any
) -> tuple[str, Any, Any] | None:
    db = request.app.state.db
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    fut = hub.register(execution_id) if hub is not None else None
    try:
        while True:
            async with db.read() as session:
                row = (
                    await session.execute(
                        sa.select(Execution.status, Execution.result, Execution.error).where(
                            Execution.id == execution_id
                        )
                    )
                ).first()
            if row is not None and row[0] in ("succeeded", "failed", "cancelled"):
                return row[0], row[1], row[2]
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            # Woken at once by a worker of this process; other processes' work is seen by polling.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(_POLL, remaining)):
                    if fut is not None:
                        await asyncio.shield(fut)
                    else:
                        await asyncio.sleep(_POLL)
            if fut is not None and fut.done():
                fut = hub.register(execution_id)
    finally:
        if fut is not None and hub is not None:
            hub.discard(execution_id, fut)
