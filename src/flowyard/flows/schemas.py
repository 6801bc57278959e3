"""Flow schemas. Bodies are validated by ``flows.validation`` (to report every
problem at once); these models describe the same shapes for OpenAPI."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import SkipJsonSchema

from flowyard.clock import Timestamp

# The graph parts refuse unknown keys, as flows.validation does (its NODE_KEYS, EDGE_KEYS, ...).
_CLOSED = ConfigDict(extra="forbid")


class EdgeConfig(BaseModel):
    model_config = _CLOSED

    condition: str | None = Field(None, description="JSONata; the message passes when it is truthy.")
    mapper: dict[str, Any] | None = Field(
        None,
        description="Object whose leaves are JSONata expressions; the target receives the mapped object.",
    )


class RetryPolicy(BaseModel):
    """SPEC §11: a failed attempt runs again after min(maxInterval, initialInterval x
    backoff^(n-1)) seconds, spread by ± jitter, until maxAttempts; errors the component marks
    not retryable fail at once."""

    model_config = _CLOSED

    maxAttempts: int = Field(1, ge=1, le=20, description="Attempts in all (1: no retry).")
    initialInterval: float = Field(
        1.0, ge=0, le=604800, description="Seconds before the second attempt (at most 7 days)."
    )
    backoff: float = Field(2.0, ge=1, le=100, description="Factor the interval grows by per attempt.")
    maxInterval: float = Field(
        300.0,
        ge=0,
        le=604800,
        description="Longest interval (seconds, at most 7 days); a Retry-After within it is honoured.",
    )
    jitter: float = Field(0.1, ge=0, le=1, description="Spread of each interval, ± this fraction.")


class Node(BaseModel):
    model_config = _CLOSED

    id: str = Field(min_length=1, max_length=64)
    componentId: str | None = Field(
        None, max_length=200, description="An installed component (GET /components)."
    )
    credentials_id: str | None = Field(
        None, max_length=64, description="Id of a stored secret handed to the component."
    )
    function: str | None = Field(
        None, max_length=200, description="Function of the component; default: its default function."
    )
    name: str | None = Field(None, max_length=200)
    description: str | None = Field(None, max_length=5000)
    fields: dict[str, Any] | None = Field(None, description="Arguments of the component.")
    retry: RetryPolicy | None = Field(None, description="Retry policy of the step (SPEC §11).")


class Edge(BaseModel):
    model_config = _CLOSED

    id: str | None = Field(None, max_length=64)
    source: str = Field(max_length=64)
    target: str = Field(max_length=64)
    config: EdgeConfig | None = None
    on: Literal["success", "failure"] = Field(
        "success",
        description='"failure": taken only when the source step failed after its last attempt; the '
        "target receives {error: {message, step, component, attempts}, input} (SPEC §11).",
    )


class FlowGraph(BaseModel):
    model_config = _CLOSED

    nodes: list[Node] = Field(
        min_length=1, description="Flat array; one inner array of nodes is accepted on input."
    )
    edges: list[Edge] | None = Field(default_factory=list, description="null: no edges.")


class Owner(BaseModel):
    model_config = _CLOSED

    id: str
    type: Literal["user", "tenant"]


FlowType = Literal["ordinary", "realtime"]
FlowStatus = Literal["active", "inactive", "starting", "stopping"]


class MutableFlow(BaseModel):
    """Writable fields of a flow. On PATCH every field is optional; ``null`` clears an optional one."""

    model_config = ConfigDict(title="MutableFlow")

    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(None, max_length=5000)
    tenant: str | None = Field(None, max_length=64)
    graph: FlowGraph
    type: Literal["ordinary", "realtime", "long_running"] = Field(
        description="long_running is accepted as a synonym of realtime and stored as realtime."
    )
    cron: str | None = Field(
        None,
        description="UTC cron: 5 fields, 6 with seconds first, or @hourly-style macros. "
        "Unset: webhook-driven.",
    )
    owners: list[Owner] | None = None
    webhookSecret: str | None = Field(
        None,
        min_length=16,
        max_length=200,
        description="Write-only. When set, webhooks must carry "
        'X-Flowyard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + raw body>.',
    )
    errorFlowId: str | None = Field(
        None,
        description="A flow (another one, sharing an owner with this one) started with trigger "
        '"error" when an execution of this flow ends failed (SPEC §11). null clears it.',
    )


class Flow(BaseModel):
    id: str
    name: str
    description: str | None = None
    tenant: str | None = None
    graph: FlowGraph
    type: FlowType
    cron: str | None = None
    owners: list[Owner]
    status: FlowStatus
    statusMessage: str | None = None
    nextRunAt: Timestamp | None = None
    lastExecutionAt: Timestamp | None = None
    fromTemplate: str | None = None
    webhookSigned: bool = False
    errorFlowId: str | None = None
    version: int = Field(
        description="The current version (SPEC §12): moved by every change of graph, cron or errorFlowId."
    )
    createdAt: Timestamp
    updatedAt: Timestamp


class FlowStatusChange(BaseModel):
    id: str
    status: FlowStatus


class FlowVersionSummary(BaseModel):
    flowId: str
    version: int
    author: str | None = Field(
        None, description="The user whose change made it (null: from before versions)."
    )
    createdAt: Timestamp
    restoredFrom: int | None = Field(None, description="The version it restored, when made by a restore.")
    current: bool


class FlowVersion(FlowVersionSummary):
    graph: FlowGraph
    cron: str | None = None
    errorFlowId: str | None = None


class FlowDocument(BaseModel):
    """A portable flow (``GET /flows/{id}/export``, ``POST /flows/import``): no ids, owners,
    tenant or secrets; a node's credentials are named by ``credentials_name``."""

    model_config = ConfigDict(title="FlowDocument")

    flowyard: int = Field(1, description="The document format version.")
    name: str
    description: str | None = None
    type: FlowType
    cron: str | None = None
    graph: FlowGraph


def partial_of(model: type[BaseModel], title: str) -> type[BaseModel]:
    """The PATCH body of ``model``, made from it so the two cannot drift: every field optional
    (omitted: unchanged). A field required on create may be omitted but not null (the server
    refuses ``name: null``); the others may be null, which clears them."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        new = copy.copy(info)
        new.default, new.default_factory = None, None
        annotation: Any = info.annotation
        no_null: Any = SkipJsonSchema[None]  # type: ignore[misc]
        annotation = annotation | no_null if info.is_required() else annotation | None
        fields[name] = (annotation, new)
    config = ConfigDict(**{**model.model_config, "title": title})
    partial: type[BaseModel] = create_model(title, __config__=config, **fields)
    return partial


MutableFlowPatch = partial_of(MutableFlow, "MutableFlowPatch")
