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


class HistoryPageMeta(PageMeta):
    total: int = Field(
        description="How many match; in the history lists and the flow lists with `search` or "
        "`filter[user]`, counted up to 1,000 past the start of the page (docs/api.md "
        '"Totals of the lists"): exact when `totalExact` is true, else a lower bound.'
    )
    totalExact: bool = Field(
        description="false: more than `total` match (the count stopped at its bound); "
        "`totalPages` then counts the pages known so far."
    )


class HistoryPage(BaseModel, Generic[T]):
    """A page of a list whose total may be bounded: the history (executions, logs) and the
    flows (with ``search`` or ``filter[user]``; the other flow lists are always exact)."""

    data: list[T]
    meta: HistoryPageMeta

    @classmethod
    def model_parametrized_name(cls, params: tuple[Any, ...]) -> str:
        # The schema keeps the name it had as Page[X] (PageExecutionOut, PageLogEntryOut in
        # generated clients, and PageFlow); only its meta gained ``totalExact``.
        return f"Page[{getattr(params[0], '__name__', params[0])}]"


def single(data: Any, status_code: int = 200) -> JSONOut:
    return JSONOut({"data": data, "meta": {}}, status_code=status_code)


def page(data: list[Any], *, page: int, per_page: int, total: int) -> JSONOut:
    return JSONOut({"data": data, "meta": page_meta(page=page, per_page=per_page, total=total)})


def history_page(data: list[Any], *, page: int, per_page: int, total: int, exact: bool) -> JSONOut:
    """``page`` for the history lists: ``meta.totalExact`` says whether ``total`` is exact."""
    meta: dict[str, Any] = {**page_meta(page=page, per_page=per_page, total=total), "totalExact": exact}
    return JSONOut({"data": data, "meta": meta})


def page_meta(*, page: int, per_page: int, total: int) -> dict[str, int]:
    return {
        "page": page,
        "perPage": per_page,
        "total": total,
        "totalPages": (total + per_page - 1) // per_page,
    }
