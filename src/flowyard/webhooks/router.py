"""HTTP for incoming webhooks: ``POST /webhooks/{flowId}``.

This route documents the endpoint and serves it when the ASGI fast path
(``webhooks/fastpath.py``) is not in front; both call ``handler.handle``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from pydantic import BaseModel

from flowyard.api.docs import errors
from flowyard.api.responses import JSONOut, Single
from flowyard.webhooks import handler

router = APIRouter(tags=["webhooks"])


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
        **errors(400, 401, 404, 409, 413, 415, 429, 503),
        429: {
            **errors(429)[429],
            "headers": {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
        },
        502: {
            "description": "With ?wait=: the execution failed or was cancelled (a generic message "
            "with the execution id; the details are in the execution and its logs)",
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
        float | None, Query(gt=0, le=handler.MAX_WAIT, description="Seconds to wait for the result.")
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
            description='t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + raw body> (several v1 '
            "allowed); required when the flow has a webhookSecret; accepted within the tolerance window.",
        ),
    ] = None,
) -> JSONOut:
    state = request.app.state
    reply = await handler.handle(
        db=state.db,
        batcher=state.webhooks,
        hub=state.hub,
        poll=state.settings.wait_poll_interval,
        flow_id=flowId,
        content_type=request.headers.get("content-type"),
        raw=await request.body(),
        wait=wait,
        idempotency_key=idempotency_key,
        signature=signature,
    )
    return JSONOut(reply.body, status_code=reply.status, headers=reply.headers or None)
