"""``GET /metrics``: the Prometheus text format (HTTP only; the access rule and the
samples are ``flowyard.metrics``'s)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from flowyard import metrics
from flowyard.api.docs import errors
from flowyard.errors import Forbidden

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Prometheus metrics of every process of this service",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        403: {**errors(403)[403], "description": "Not a loopback client, or no valid metrics token"},
    },
    description="Loopback clients only, unless FLOWYARD_METRICS_TOKEN is set: then "
    "`Authorization: Bearer <that token>` only.",
)
async def get_metrics(request: Request) -> Response:
    settings = request.app.state.settings
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    client = request.client.host if request.client else None
    if not metrics.allowed(client, request.headers.get("authorization"), token):
        raise Forbidden("Metrics are readable from loopback, or with the metrics bearer token.")
    gauges: metrics.QueueGauges | None = getattr(request.app.state, "queue_gauges", None)
    queue = await gauges.get() if gauges is not None else None
    return Response(metrics.exposition(queue), media_type=metrics.CONTENT_TYPE)
