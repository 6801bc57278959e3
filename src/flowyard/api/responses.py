"""Response envelopes and a fast JSON response."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

T = TypeVar("T")


class JSONOut(Response):
    """JSON via orjson. Handlers build plain dicts; the schemas document them."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class PageMeta(BaseModel):
    page: int
    perPage: int
    total: int
    totalPages: int


class Single(BaseModel, Generic[T]):
    model_config = ConfigDict(extra="forbid")

    data: T
    meta: dict[str, Any] = Field(default_factory=dict)


class Page(BaseModel, Generic[T]):
    data: list[T]
    meta: PageMeta


def single(data: Any, status_code: int = 200) -> JSONOut:
    return JSONOut({"data": data, "meta": {}}, status_code=status_code)


def page(data: list[Any], *, page: int, per_page: int, total: int) -> JSONOut:
    return JSONOut({"data": data, "meta": page_meta(page=page, per_page=per_page, total=total)})


def page_meta(*, page: int, per_page: int, total: int) -> dict[str, int]:
    return {
        "page": page,
        "perPage": per_page,
        "total": total,
        "totalPages": (total + per_page - 1) // per_page,
    }
