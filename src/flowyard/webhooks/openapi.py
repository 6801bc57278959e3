"""The OpenAPI description of ``POST /webhooks/{flowId}``.

The endpoint is served by the ASGI fast path (``webhooks/fastpath.py``), not by
a FastAPI route, so its document is written out here and added to the app's
(``app._install_openapi``); ``tests/api/test_openapi.py`` holds it to what
``handler.parse`` accepts.
"""

from __future__ import annotations

from typing import Any

from flowyard.api.docs import errors
from flowyard.jsonvalue import MAX_DEPTH
from flowyard.webhooks.handler import MAX_WAIT
from flowyard.webhooks.signature import SIGNATURE_FORMAT

PATH = "/webhooks/{flowId}"
_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}

SCHEMAS: dict[str, Any] = {
    "WebhookAccepted": {
        "title": "WebhookAccepted",
        "type": "object",
        "properties": {
            "executionId": {"type": "string", "title": "Executionid"},
            "flowId": {"type": "string", "title": "Flowid"},
            "status": {"type": "string", "title": "Status", "enum": ["queued"]},
        },
        "required": ["executionId", "flowId", "status"],
    },
    "Single_WebhookAccepted_": {
        "title": "Single[WebhookAccepted]",
        "type": "object",
        "properties": {
            "data": {"$ref": "#/components/schemas/WebhookAccepted"},
            "meta": {"type": "object", "title": "Meta", "additionalProperties": True},
        },
        "required": ["data"],
        "additionalProperties": False,
    },
}


def _param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema,
    }


OPERATION: dict[str, Any] = {
    "tags": ["webhooks"],
    "summary": "Trigger an execution of an active flow with the posted JSON",
    "description": "Anonymous. The execution row is stored durably before the answer: `202` with its id, "
    "or with `wait` the flow's reply. Refusals carry no internal detail. The body is any JSON value "
    f"(a scalar too) nesting at most {MAX_DEPTH} levels of arrays and objects; a deeper one is refused "
    "with `400`.",
    "operationId": "receive_webhooks__flowId__post",
    "parameters": [
        _param("flowId", "path", "Id of an active flow without cron.", {"type": "string"}),
        _param(
            "wait",
            "query",
            "Seconds to wait for the result.",
            {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT},
        ),
        _param(
            "Idempotency-Key",
            "header",
            "Repeats with the same key within 24 h return the first answer.",
            {"type": "string", "minLength": 1, "maxLength": 255},
        ),
        _param(
            "X-Flowyard-Signature",
            "header",
            f"{SIGNATURE_FORMAT} (several v1 allowed); required when the flow has a webhookSecret; "
            "accepted within the tolerance window.",
            {"type": "string"},
        ),
    ],
    "requestBody": {"required": True, "content": {"application/json": {"schema": {}}}},
    "responses": {
        "202": {
            "description": "Stored and queued (also a replay of an earlier Idempotency-Key, marked "
            "Idempotent-Replayed: true)",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Single_WebhookAccepted_"}}
            },
            "headers": {
                "Idempotent-Replayed": {
                    "description": "true when the answer repeats an earlier request's",
                    "schema": {"type": "string", "enum": ["true"]},
                }
            },
        },
        "200": {
            "description": "With ?wait=: the reply set by a respond node, or the last message's data",
            "content": {"application/json": {"schema": {}}},
        },
        **errors(400, 404, 409, 413, 415, 503),
        "401": {
            "description": "X-Flowyard-Signature missing, malformed, wrong or too old",
            "content": _ERROR,
        },
        "429": {
            **errors(429)[429],
            "headers": {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
        },
        "502": {
            "description": "With ?wait=: the execution failed or was cancelled (a generic message "
            "with the execution id; the details are in the execution and its logs)",
            "content": _ERROR,
        },
    },
}


def document(schema: dict[str, Any]) -> None:
    """Add the endpoint and its schemas to the app's OpenAPI document."""
    schema.setdefault("paths", {})[PATH] = {"post": OPERATION}
    schema.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
