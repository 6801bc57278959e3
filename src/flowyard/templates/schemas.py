"""Template schemas. Bodies are validated by ``flows.validation`` (``template=True``)
so every problem is reported at once; these models describe the shapes for OpenAPI."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flowyard.clock import Timestamp
from flowyard.flows.schemas import FlowGraph, Owner, partial_of

TemplateStatus = Literal["published", "draft"]


class MutableFlowTemplate(BaseModel):
    """Writable fields of a template: MutableFlow without ``tenant``, plus ``status`` and ``tags``.

    On PATCH every field is optional; ``null`` clears an optional one.
    """

    model_config = ConfigDict(title="MutableFlowTemplate")

    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(None, max_length=5000)
    graph: FlowGraph
    type: Literal["ordinary", "realtime", "long_running"] = Field(
        description="long_running is accepted as a synonym of realtime and stored as realtime."
    )
    cron: str | None = Field(
        None, description="UTC cron expression copied into flows made from the template."
    )
    owners: list[Owner] | None = Field(
        None,
        description="Who may see the template. Omitted on create: the creator. `[]`: nobody but "
        "administrators, unless `shared`.",
    )
    # null is taken as omitted for these three (flows.validation), so the document allows it.
    status: TemplateStatus | None = "draft"
    tags: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        default_factory=list, max_length=100
    )
    shared: bool | None = Field(
        False, description="A catalog template: every caller with flowTemplates.read sees it, owners or not."
    )


MutableFlowTemplatePatch = partial_of(MutableFlowTemplate, "MutableFlowTemplatePatch")


class FlowTemplate(BaseModel):
    id: str
    name: str
    description: str | None = None
    graph: FlowGraph
    type: Literal["ordinary", "realtime"]
    cron: str | None = None
    owners: list[Owner]
    status: TemplateStatus
    tags: list[str]
    shared: bool
    createdAt: Timestamp
    updatedAt: Timestamp


class FlowFromTemplate(BaseModel):
    """Overrides for a flow made from a template; the body may be omitted."""

    model_config = ConfigDict(title="FlowFromTemplate", extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=200, description="Default: the template's name.")
    description: str | None = Field(
        None, max_length=5000, description="null clears the template's description."
    )
    cron: str | None = Field(None, description="null makes the flow webhook-driven.")
    fields: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Per node id, fields merged over the template node's fields (given keys replace).",
        examples=[{"fetch": {"url": "https://example.com/orders"}}],
    )
