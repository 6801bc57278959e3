"""HTTP for executions and execution counts."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from flowyard.api.deps import DB, read_json
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, parse_list_query
from flowyard.api.responses import HistoryPage, JSONOut, Single, history_page, single
from flowyard.clock import utcnow
from flowyard.errors import InvalidInput, Problem
from flowyard.executions import replay, service
from flowyard.executions.schemas import CountsResponse, ExecutionDetail, ExecutionOut, ExecutionQueued
from flowyard.flows.service import check_id
from flowyard.iam.deps import Caller
from flowyard.ids import ID_PATTERN
from flowyard.queue.notify import WORK, finished_messages

_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
DAY_PARAM = {"format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}
ID_PARAM = {"pattern": ID_PATTERN}


router = APIRouter()


@router.post(
    "/flows/{id}/executions",
    tags=["executions"],
    status_code=202,
    response_model=Single[ExecutionQueued],
    responses=errors(400, 401, 403, 404, 409, 413, 415),
    openapi_extra={"requestBody": {"required": False, "content": {"application/json": {"schema": {}}}}},
    summary="Run an active flow once by hand with the posted JSON (tenant.flows.update)",
)
async def run_flow(
    id: Annotated[str, Path(description="Flow id.")], request: Request, db: DB, caller: Caller
) -> JSONOut:
    check_id(id)
    payload = await read_json(request, required=False, data=True)
    notifier = request.app.state.notifier
    async with db.write() as session:
        eid = await service.run_manually(session, caller, id, payload if payload is not None else {})
        await notifier.stage(session, [WORK])
    notifier.committed([WORK])
    engine = request.app.state.engine
    if engine is not None:
        engine.wake_worker()
    return single({"executionId": eid, "flowId": id, "status": "queued"}, 202)


ExecutionStatus = Annotated[
    str | None,
    Query(
        alias="filter[status]",
        description="One of the execution statuses.",
        json_schema_extra={"enum": list(service.EXECUTION_STATUSES)},
    ),
]


@router.get(
    "/flows/{id}/executions",
    tags=["executions"],
    response_model=HistoryPage[ExecutionOut],
    responses=errors(400, 401, 403, 404),
    summary="List a flow's executions, newest first (tenant.flows.read)",
)
async def list_flow_executions(
    id: Annotated[str, Path(description="Flow id.")],
    request: Request,
    db: DB,
    caller: Caller,
    _size: PageSize = None,
    _number: PageNumber = None,
    _status: ExecutionStatus = None,
) -> JSONOut:
    lq = parse_list_query(request, filters=service.FLOW_EXECUTION_FILTERS)
    async with db.read() as session:
        rows, total, exact = await service.list_flow_executions(session, caller, id, lq)
    return history_page(
        [service.to_dict(e) for e in rows], page=lq.page, per_page=lq.size, total=total, exact=exact
    )


@router.get(
    "/executions",
    tags=["executions"],
    response_model=HistoryPage[ExecutionOut],
    responses=errors(400, 401, 403),
    summary="List executions of the flows the caller sees, newest first (tenant.flows.read)",
)
async def list_executions(
    request: Request,
    db: DB,
    caller: Caller,
    _size: PageSize = None,
    _number: PageNumber = None,
    _flow: Annotated[
        str | None,
        Query(alias="filter[flowId]", description="Only this flow's executions.", json_schema_extra=ID_PARAM),
    ] = None,
    _status: ExecutionStatus = None,
) -> JSONOut:
    lq = parse_list_query(request, filters=service.EXECUTION_FILTERS)
    async with db.read() as session:
        rows, total, exact = await service.list_executions(session, caller, lq)
    return history_page(
        [service.to_dict(e) for e in rows], page=lq.page, per_page=lq.size, total=total, exact=exact
    )


@router.get(
    "/executions/{id}",
    tags=["executions"],
    response_model=Single[ExecutionDetail],
    responses=errors(400, 401, 403, 404),
    summary="Read an execution with its step results (tenant.flows.read)",
)
async def get_execution(
    id: Annotated[str, Path(description="Execution id.")], db: DB, caller: Caller
) -> JSONOut:
    async with db.read() as session:
        e = await service.get_execution(session, caller, id)
    return single({**service.to_dict(e), "steps": service.steps_of(e)})


async def _replayed(request: Request, db: DB, caller: Caller, id: str, how: Any) -> JSONOut:
    notifier = request.app.state.notifier
    async with db.write() as session:
        e = await how(session, caller, id)
        await notifier.stage(session, [WORK])
    notifier.committed([WORK])
    engine = request.app.state.engine
    if engine is not None:
        engine.wake_worker()
    return single(service.to_dict(e), 202)


@router.post(
    "/executions/{id}/retry",
    tags=["executions"],
    status_code=202,
    response_model=Single[ExecutionOut],
    responses=errors(400, 401, 403, 404, 409),
    summary="Retry a failed or cancelled execution from the step it failed at, with that step's "
    "input; the steps before it are carried over (tenant.flows.update)",
)
async def retry_execution(
    id: Annotated[str, Path(description="Execution id.")], request: Request, db: DB, caller: Caller
) -> JSONOut:
    return await _replayed(request, db, caller, id, replay.retry)


@router.post(
    "/executions/{id}/rerun",
    tags=["executions"],
    status_code=202,
    response_model=Single[ExecutionOut],
    responses=errors(400, 401, 403, 404, 409),
    summary="Run a finished execution's trigger data again on the flow's current version "
    "(tenant.flows.update)",
)
async def rerun_execution(
    id: Annotated[str, Path(description="Execution id.")], request: Request, db: DB, caller: Caller
) -> JSONOut:
    return await _replayed(request, db, caller, id, replay.rerun)


@router.post(
    "/executions/{id}/cancel",
    tags=["executions"],
    response_model=Single[ExecutionOut],
    responses=errors(400, 401, 403, 404, 409),
    summary="Cancel a queued, waiting or running execution; a running step is interrupted "
    "(tenant.flows.update)",
)
async def cancel_execution(
    id: Annotated[str, Path(description="Execution id.")], request: Request, db: DB, caller: Caller
) -> JSONOut:
    notifier = request.app.state.notifier
    async with db.write() as session:
        e = await replay.cancel(session, caller, id)
        # Whoever waits for it (a webhook's ?wait=) is answered now.
        messages = finished_messages([(e.id, e.status, None, e.error)])
        await notifier.stage(session, messages)
    notifier.committed(messages)
    return single(service.to_dict(e))


def _parse_day(raw: str | None, name: str, default: date, problems: list[Problem]) -> date:
    if raw is None:
        return default
    try:
        if not _DAY.fullmatch(raw):
            raise ValueError
        return date.fromisoformat(raw)
    except ValueError:
        problems.append(Problem(f"{name} must be a date YYYY-MM-DD.", name))
        return default


@router.get(
    "/icenter/executions",
    tags=["executions"],
    response_model=CountsResponse,
    responses=errors(400, 401),
    summary="Execution counts per user, flow or component over a time frame (UTC days, inclusive)",
)
async def execution_counts(
    db: DB,
    caller: Caller,
    start: Annotated[
        str | None,
        Query(description="YYYY-MM-DD, inclusive; default one month ago", json_schema_extra=DAY_PARAM),
    ] = None,
    end: Annotated[
        str | None, Query(description="YYYY-MM-DD, inclusive; default today", json_schema_extra=DAY_PARAM)
    ] = None,
    groupby: Annotated[
        str | None,
        Query(
            description="user (default), flow or component",
            json_schema_extra={"enum": list(service.GROUPINGS)},
        ),
    ] = None,
) -> JSONOut:
    problems: list[Problem] = []
    today = utcnow().date()
    end_day = _parse_day(end, "end", today, problems)
    start_day = _parse_day(start, "start", _month_before(today), problems)
    group = "user" if groupby is None else groupby
    if group not in service.GROUPINGS:
        problems.append(Problem("groupby must be user, flow or component.", "groupby"))
    if not problems and start_day > end_day:
        problems.append(Problem("start must not be after end.", "start"))
    if problems:
        raise InvalidInput(problems)
    async with db.read() as session:
        data, total = await service.counts(session, caller, start=start_day, end=end_day, groupby=group)
    body: dict[str, Any] = {
        "data": data,
        "metadata": {"start": start_day.isoformat(), "end": end_day.isoformat(), "totalExecutions": total},
    }
    return JSONOut(body)


def _month_before(day: date) -> date:
    month = day.month - 1 or 12
    year = day.year - (1 if day.month == 1 else 0)
    for d in (day.day, 30, 29, 28):
        try:
            return date(year, month, d)
        except ValueError:
            continue
    return day - timedelta(days=30)
