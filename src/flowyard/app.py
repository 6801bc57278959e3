"""The FastAPI application factory."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowyard import __version__
from flowyard import metrics as metric_values
from flowyard.api import health, reference
from flowyard.api import metrics as metrics_router
from flowyard.api.docs import complete
from flowyard.api.errors import ERROR_SCHEMA, install_error_handlers
from flowyard.api.middleware import RequestContextMiddleware
from flowyard.api.paths import RequestRules, answer
from flowyard.components import builtins
from flowyard.components import router as components_router
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.console import router as console_router
from flowyard.db.session import Database
from flowyard.enginehost import EngineServices
from flowyard.executions import router as executions_router
from flowyard.flows import router as flows_router
from flowyard.flows.schemas import MutableFlow, MutableFlowPatch
from flowyard.iam import router as iam_router
from flowyard.iam import schemas as iam_schemas
from flowyard.iam.cache import PrincipalCache
from flowyard.ids import ID_PATTERN
from flowyard.logs import router as logs_router
from flowyard.queue import store as queue
from flowyard.queue.accept import WebhookBatcher, WebhookLimits
from flowyard.queue.hub import CompletionHub
from flowyard.queue.notify import Notifier, open_notifier
from flowyard.secrets import router as secrets_router
from flowyard.secrets.crypto import SecretBox, load_key
from flowyard.secrets.schemas import SecretCreate, SecretRotate
from flowyard.templates import router as templates_router
from flowyard.templates.schemas import FlowFromTemplate, MutableFlowTemplate, MutableFlowTemplatePatch
from flowyard.trials import router as trials_router
from flowyard.trials.schemas import StepTrial
from flowyard.trials.service import Trials
from flowyard.webhooks import fastpath, signature
from flowyard.webhooks import openapi as webhooks_openapi

log = logging.getLogger("flowyard")

# Bodies read by hand (to report every problem at once and to answer 415/413
# ourselves); their schemas are added to the OpenAPI components here.
_BODY_MODELS: list[type[BaseModel]] = [
    MutableFlow,
    MutableFlowPatch,
    MutableFlowTemplate,
    MutableFlowTemplatePatch,
    FlowFromTemplate,
    iam_schemas.Login,
    iam_schemas.TokenCreate,
    iam_schemas.Introspect,
    iam_schemas.UserCreate,
    iam_schemas.UserUpdate,
    iam_schemas.TenantCreate,
    iam_schemas.RoleCreate,
    iam_schemas.RoleUpdate,
    SecretCreate,
    SecretRotate,
    StepTrial,
]


class _FlowyardAPI(FastAPI):
    """FastAPI, with ``POST /webhooks/{flowId}`` answered before the framework's own layers.

    A webhook goes straight to flowyard's middleware chain (request id, metrics, body limit,
    request rules) ending in the webhook fast path, which answers every outcome itself, errors
    included, in the contract's shape. It skips FastAPI's per-request telemetry check (it reads
    the environment on every request), Starlette's error and body-limit middlewares and the
    routing, about 5 % of the API process's CPU under the peer bench's load
    (docs/performance.md). Every other request takes the whole stack, the same chain included.
    Tests over ASGI and uvicorn both call this, so both take the same path.

    When an OpenTelemetry provider is configured (FastAPI's native telemetry is on), webhooks
    take the whole stack too, so they keep their spans and metrics: decided at the first
    webhook, once the process has configured what it will."""

    webhook_chain: ASGIApp | None = None
    _front: bool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chain = self.webhook_chain
        if chain is not None and fastpath.serves(scope):
            front = self._front
            if front is None:
                telemetry = getattr(self, "_native_telemetry", None)
                front = self._front = not (telemetry is not None and telemetry.enabled())
            if front:
                scope["app"] = self
                await _answered(chain, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _answered(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app``'s answer; if it fails before answering, a 500 in the contract's shape (what the
    framework's error middleware answers for any other request), the cause logged."""
    started = False

    async def tracked(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, tracked)
    except Exception:
        log.exception("a webhook request failed unexpectedly")
        if started:
            return
        rid = scope.get("state", {}).get("request_id", "-")
        await answer(send, 500, f"Internal error (request id {rid}).")


def create_app(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    registry: Registry | None = None,
    run_engine: bool = True,
) -> FastAPI:
    """Build the app. ``run_engine=False`` serves the API only (workers run elsewhere)."""
    settings = settings or Settings()
    registry = registry or Registry.load(builtins.ALL)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_db = db is None
        app.state.db = db or Database(settings.resolved_database_url(), direct=settings.sqlite_direct)
        notifier = open_notifier(settings.resolved_database_url(), settings.notify_database_url)
        # Executions finished by any process complete this process's ?wait= requests.
        notifier.subscribe(on_finished=app.state.hub.finish)
        await notifier.start()
        app.state.notifier = notifier
        engine = None
        if run_engine:
            engine = EngineServices(
                app.state.db, settings, registry, box=box, hub=app.state.hub, notifier=notifier
            )
            await engine.start()
        app.state.engine = engine
        app.state.trials = Trials(settings, engine.worker.pool if engine is not None else None)
        app.state.webhooks = WebhookBatcher(
            app.state.db,
            window_ms=settings.webhook_group_commit_ms,
            on_commit=engine.wake_worker if engine is not None else None,
            limits=WebhookLimits.from_settings(settings, box, verify=signature.check),
            notifier=notifier,
        )
        try:
            yield
        finally:
            await app.state.webhooks.close()
            await app.state.trials.close()
            if engine is not None:
                await engine.stop()
            await notifier.close()
            if own_db:
                await app.state.db.dispose()

    app = _FlowyardAPI(
        title="flowyard",
        version=__version__,
        description="Integration flows: store, start and stop them, trigger them by webhook or cron, "
        "and read their executions, counts and logs.",
        lifespan=lifespan,
        docs_url=None,  # api/reference.py serves /docs and /redoc from shipped files
        redoc_url=None,
        # A trailing slash is dropped by RequestRules (api/paths.py), not redirected.
        redirect_slashes=False,
    )
    box = SecretBox(load_key(settings.configured_secret_key(), settings.data_dir))
    app.state.settings = settings
    app.state.registry = registry
    app.state.secret_box = box
    app.state.principals = PrincipalCache(settings.auth_cache_seconds)
    app.state.engine = None
    app.state.trials = Trials(settings, None)  # the lifespan hands it the engine's pool
    app.state.draining = False  # set by the first SIGTERM/SIGINT (flowyard.server)
    app.state.hub = CompletionHub()

    async def read_queue() -> tuple[dict[str, int], float]:
        async with app.state.db.read() as session:
            return await queue.depth(session)

    app.state.queue_gauges = metric_values.QueueGauges(read_queue)
    app.state.notifier = Notifier()
    if db is not None:  # usable without running the lifespan (tests over ASGI)
        app.state.db = db
        app.state.webhooks = WebhookBatcher(
            db,
            window_ms=settings.webhook_group_commit_ms,
            limits=WebhookLimits.from_settings(settings, box, verify=signature.check),
        )
    install_error_handlers(app)
    # Added last runs first: request ids and the body limit wrap every request, the webhook fast
    # path too (it serves webhooks here only when _FlowyardAPI sends them through the stack).
    app.add_middleware(fastpath.WebhookFastPath, state=app.state)
    app.add_middleware(RequestRules, routes=lambda: app.routes)
    app.add_middleware(RequestContextMiddleware, max_body_bytes=settings.max_body_bytes)
    # The same chain in front of the webhook fast path, for the webhooks _FlowyardAPI answers
    # before the framework's layers (the fast path passes nothing on: it serves only those).
    app.webhook_chain = RequestContextMiddleware(
        RequestRules(fastpath.WebhookFastPath(_not_served, state=app.state), routes=lambda: app.routes),
        max_body_bytes=settings.max_body_bytes,
    )
    for module in (
        health,
        metrics_router,
        iam_router,
        flows_router,
        templates_router,
        secrets_router,
        executions_router,
        logs_router,
        components_router,
        trials_router,
    ):
        app.include_router(module.router)
    app.include_router(console_router.router)
    app.include_router(reference.router)
    app.mount("/console/static", console_router.static_files, name="console-static")
    _install_openapi(app)
    return app


async def _not_served(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("the webhook chain got a request the fast path does not serve")


def _install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["ErrorResponse"] = ERROR_SCHEMA
        webhooks_openapi.document(schema)  # served by the ASGI fast path, not a route
        for model in _BODY_MODELS:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in model_schema.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = model_schema
        # FastAPI documents 422 for parameter validation; we answer 400 in the error shape.
        for path in schema.get("paths", {}).values():
            for op in path.values():
                for param in op.get("parameters", []):
                    _drop_null_alternative(param)
                responses = op.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {
                        "description": "Invalid parameter",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
                        },
                    }
        complete(schema, id_pattern=ID_PATTERN)
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _drop_null_alternative(param: dict[str, Any]) -> None:
    """``str | None`` parameters come out as ``anyOf: [string, null]``. A query string cannot
    say null (leaving the parameter out can), so document the plain type."""
    schema = param.get("schema", {})
    options = schema.get("anyOf")
    if isinstance(options, list):
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) == 1 and len(rest) < len(options):
            schema.pop("anyOf")
            schema.update(rest[0])
