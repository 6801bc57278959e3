"""HTTP for the component registry."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from flowyard.api.docs import errors
from flowyard.api.responses import JSONOut, Single, single
from flowyard.iam.deps import Caller

router = APIRouter(tags=["components"])


class ComponentFunctionOut(BaseModel):
    name: str
    description: str | None = None
    default: bool


class ComponentOut(BaseModel):
    id: str
    description: str
    trigger: bool
    functions: list[ComponentFunctionOut]
    fields: dict[str, Any]


@router.get(
    "/components",
    response_model=Single[list[ComponentOut]],
    responses=errors(401),
    summary="Installed components, their functions and the JSON schema of their fields",
)
async def list_components(request: Request, _caller: Caller) -> JSONOut:
    registry = request.app.state.registry
    return single(
        [
            {
                "id": c.id,
                "description": c.description,
                "trigger": c.trigger,
                "functions": [
                    {
                        "name": f,
                        "description": c.function_descriptions.get(f),
                        "default": f == c.default_function,
                    }
                    for f in sorted(c.functions)
                ],
                "fields": c.fields_schema(),
            }
            for c in registry.all()
        ]
    )
