"""Dependencies shared by every router: database, settings, JSON body. The caller (who sent the
request) is identity's: ``flowyard.iam.deps.Caller``; this kit imports no domain."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError

from flowyard import jsonvalue
from flowyard.api.problems import validation_problems
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.errors import InvalidInput, Problem, UnsupportedMediaType


# Dependencies are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread,
# a thread hop per request for a dictionary lookup (~20 % of GET /flows/{id}'s CPU).
async def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


DB = Annotated[Database, Depends(get_db)]
AppSettings = Annotated[Settings, Depends(get_settings)]


def is_json_content_type(value: str | None) -> bool:
    if not value:
        return False
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_json(request: Request, *, required: bool = True, data: bool = False) -> Any:
    """The request body as JSON: 415 for another content type, 400 if it does not parse or nests
    deeper than ``jsonvalue.MAX_DEPTH``, and 400 naming each string (value or key) that holds
    U+0000 (``jsonvalue.nul_paths``: text we store cannot hold it on PostgreSQL). ``data=True``
    is for a payload kept as a JSON document (a manual run's input, like a webhook's): NUL
    inside its strings is data, stored escaped on both databases."""
    raw = await request.body()
    if not raw:
        if required:
            if not is_json_content_type(request.headers.get("content-type")):
                raise UnsupportedMediaType()
            raise InvalidInput("A JSON body is required.")
        return None
    if not is_json_content_type(request.headers.get("content-type")):
        raise UnsupportedMediaType()
    try:
        value = jsonvalue.loads(raw)
    except jsonvalue.TooDeep as exc:
        raise InvalidInput(f"The body {exc}.") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"The body is not valid JSON: {exc}") from None
    if not data:
        paths = jsonvalue.nul_paths(value)
        if paths:
            raise InvalidInput([nul_problem(path) for path in paths])
    return value


def nul_problem(path: str) -> Problem:
    """The answer for text holding U+0000, at ``path`` of a body (or a query parameter)."""
    message = "must not contain NUL characters (U+0000)"
    return Problem(f"{path}: {message}" if path else f"The body {message}.", path or None)


def json_body_doc(
    schema_ref: str, *, required: bool = True, array_too: bool = False, null_too: bool = False
) -> dict[str, Any]:
    """``openapi_extra`` for routes that read their JSON body by hand. ``null_too``: a JSON
    ``null`` body is taken as no body (``read_json`` returns None for both)."""
    schema: dict[str, Any] = {"$ref": f"#/components/schemas/{schema_ref}"}
    if null_too:
        schema = {"anyOf": [schema, {"type": "null"}]}
    if array_too:
        # Items are validated one by one: a bad item gets its errors in its entry of the 201
        # answer, so the array itself accepts any items.
        items = {"description": f"A {schema_ref}; an invalid item yields an errors entry, not a 400."}
        schema = {"oneOf": [schema, {"type": "array", "maxItems": 1000, "items": items}]}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    """Read and validate a JSON body against ``model``; every problem reported at once (400)."""
    raw = await read_json(request)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(validation_problems(exc.errors())) from None
