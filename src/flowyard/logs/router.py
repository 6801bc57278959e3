"""HTTP for logs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from flowyard.api.deps import DB
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, parse_list_query
from flowyard.api.responses import HistoryPage, JSONOut, history_page
from flowyard.errors import InvalidInput, Problem
from flowyard.iam.deps import Caller
from flowyard.ids import ID_PATTERN
from flowyard.logs import service
from flowyard.logs.schemas import LogEntryOut

router = APIRouter(tags=["logs"])
_ID = {"pattern": ID_PATTERN}
_TIME = {"pattern": service.TIME_PATTERN}


@router.get(
    "/logs",
    response_model=HistoryPage[LogEntryOut],
    responses=errors(400, 401, 403),
    summary="Step logs, newest first",
)
async def get_logs(
    request: Request,
    db: DB,
    caller: Caller,
    _tenant: Annotated[
        str,
        Query(alias="filter[tenant]", min_length=1, description="Required: the tenant whose logs to read."),
    ],
    _flow: Annotated[str | None, Query(alias="filter[flowId]", json_schema_extra=_ID)] = None,
    _step: Annotated[str | None, Query(alias="filter[stepId]", description="A node id.")] = None,
    _execution: Annotated[str | None, Query(alias="filter[executionId]", json_schema_extra=_ID)] = None,
    showErrors: Annotated[
        str | None,
        Query(
            description="true/1/yes: only level error; false/0/no: all (any case)",
            json_schema_extra={"pattern": service.BOOL_PATTERN},
        ),
    ] = None,
    from_: Annotated[
        str | None, Query(alias="from", description="ISO timestamp, inclusive", json_schema_extra=_TIME)
    ] = None,
    to: Annotated[str | None, Query(description="ISO timestamp, inclusive", json_schema_extra=_TIME)] = None,
    _size: PageSize = None,
    _number: PageNumber = None,
) -> JSONOut:
    lq = parse_list_query(request, filters=service.LOG_FILTERS)
    problems: list[Problem] = []
    errors_only = service.parse_bool(showErrors, "showErrors", problems)
    since = service.parse_time(from_, "from", problems)
    until = service.parse_time(to, "to", problems)
    if problems:
        raise InvalidInput(problems)
    async with db.read() as session:
        rows, total, exact = await service.query_logs(
            session, caller, lq, errors_only=errors_only, since=since, until=until
        )
    return history_page(
        [service.to_dict(e) for e in rows], page=lq.page, per_page=lq.size, total=total, exact=exact
    )
