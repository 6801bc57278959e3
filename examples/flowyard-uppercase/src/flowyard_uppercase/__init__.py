"""An example third-party flowyard component.

Install it next to flowyard (``pip install ./examples/flowyard-uppercase``),
restart the service, and ``GET /components`` lists ``uppercase``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowyard.engine.components import Component, Message
from flowyard.engine.context import StepContext


class Fields(BaseModel):
    """The node's ``fields``; validated when a flow is saved, parsed once per flow version."""

    model_config = ConfigDict(extra="forbid")

    keys: list[str] = Field(
        default_factory=list, description="Fields to upper-case; empty: every string field."
    )


async def upper(message: Message, ctx: StepContext) -> Message:
    fields: Fields = ctx.fields
    data: Any = message["data"]
    if isinstance(data, dict):
        data = {
            k: v.upper() if isinstance(v, str) and (not fields.keys or k in fields.keys) else v
            for k, v in data.items()
        }
    elif isinstance(data, str):
        data = data.upper()
    ctx.log("debug", "upper-cased", {"keys": fields.keys or "all"})
    return {"data": data, "metadata": message["metadata"]}


async def count(message: Message, ctx: StepContext) -> list[Message]:
    """A second function: one message per string field, to show fan-out."""
    data = message["data"] if isinstance(message["data"], dict) else {}
    return [
        {"data": {"key": k, "length": len(v)}, "metadata": message["metadata"]}
        for k, v in data.items()
        if isinstance(v, str)
    ]


COMPONENT = Component(
    id="uppercase",
    description="Upper-case string fields of the message data.",
    functions={"upper": upper, "count": count},
    default_function="upper",
    fields=Fields,
    function_descriptions={"upper": "Upper-case strings", "count": "One message per string field"},
)
