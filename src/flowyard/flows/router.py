"""HTTP for flows."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from flowyard.api.deps import DB, json_body_doc, read_json
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, Search, parse_list_query
from flowyard.api.responses import JSONOut, Page, Single, page, single
from flowyard.errors import FlowyardError, InvalidInput, error_body
from flowyard.flows import service
from flowyard.flows.schemas import Flow, FlowStatusChange
from flowyard.flows.status import FlowStatus
from flowyard.iam import permissions as perms
from flowyard.iam.deps import Caller

router = APIRouter(tags=["flows"])

FlowId = Annotated[str, Path(description="Flow id: 24 hex characters.")]


def _nudge(request: Request) -> None:
    engine = getattr(request.app.state, "engine", None)
    if engine is not None:
        engine.nudge_lifecycle()


@router.post(
    "/flows",
    status_code=201,
    response_model=Single[Flow] | Single[list[dict[str, Any]]],
    responses=errors(400, 401, 403, 413, 415),
    openapi_extra=json_body_doc("MutableFlow", array_too=True),
    summary="Create a flow (or several, from an array)",
)
async def create_flow(request: Request, db: DB, caller: Caller) -> JSONOut:
    body = await read_json(request)
    registry = request.app.state.registry
    seal = request.app.state.secret_box.seal  # a webhookSecret is stored sealed
    if isinstance(body, list):
        caller.require(perms.FLOWS_CREATE)
        if len(body) > 1000:
            raise InvalidInput("At most 1000 flows can be created at once.")
        results: list[Any] = []
        good = []
        for item in body:
            try:
                flow = service.prepare_new_flow(caller, item, registry, seal)
                good.append(flow)
                results.append(flow)
            except FlowyardError as exc:
                results.append(error_body(exc.status, exc.problems))
        async with db.write() as session:
            for i, entry in enumerate(results):
                if isinstance(entry, dict):
                    continue
                try:
                    await service.check_new_flow(session, caller, entry)
                except FlowyardError as exc:
                    good.remove(entry)
                    results[i] = error_body(exc.status, exc.problems)
            await service.insert_flows(session, good)
        return single([service.to_dict(r) if not isinstance(r, dict) else r for r in results], 201)
    flow = service.prepare_new_flow(caller, body, registry, seal)
    async with db.write() as session:
        await service.check_new_flow(session, caller, flow)
        await service.insert_flows(session, [flow])
    return single(service.to_dict(flow), 201)


@router.get(
    "/flows",
    response_model=Page[Flow],
    responses=errors(400, 401, 403),
    summary="List flows",
)
async def list_flows(
    request: Request,
    db: DB,
    caller: Caller,
    _size: PageSize = None,
    _number: PageNumber = None,
    _status: Annotated[
        str | None,
        Query(
            alias="filter[status]",
            description="active, inactive, starting, stopping, or 1 (active), 0 (inactive)",
            json_schema_extra={"enum": service.STATUS_FILTER_VALUES},
        ),
    ] = None,
    _type: Annotated[
        str | None,
        Query(
            alias="filter[type]",
            description="ordinary, realtime or long_running (= realtime)",
            json_schema_extra={"enum": service.TYPE_FILTER_VALUES},
        ),
    ] = None,
    _user: Annotated[
        str | None,
        Query(alias="filter[user]", min_length=1, max_length=64, description="Flows owned by this user id"),
    ] = None,
    _sort: Annotated[
        str | None,
        Query(
            alias="sort",
            description="createdAt, updatedAt or name; prefix - for descending. Default: id.",
            json_schema_extra={"enum": service.SORT_VALUES},
        ),
    ] = None,
    _search: Search = None,
) -> JSONOut:
    caller.require(perms.FLOWS_READ)
    lq = parse_list_query(request, filters=service.FLOW_FILTERS, sorts=service.FLOW_SORTS, searchable=True)
    async with db.read() as session:
        flows, total = await service.list_flows(session, caller, lq)
    return page([service.to_dict(f) for f in flows], page=lq.page, per_page=lq.size, total=total)


@router.get(
    "/flows/{id}", response_model=Single[Flow], responses=errors(400, 401, 403, 404), summary="Read a flow"
)
async def get_flow(id: FlowId, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.FLOWS_READ)
    return single(await service.read_flow(db, caller, id))


@router.patch(
    "/flows/{id}",
    response_model=Single[Flow],
    responses=errors(400, 401, 403, 404, 409, 413, 415),
    openapi_extra=json_body_doc("MutableFlowPatch"),
    summary="Update an inactive flow",
)
async def patch_flow(id: FlowId, request: Request, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.FLOWS_UPDATE)
    body = await read_json(request)
    async with db.write() as session:
        flow = await service.update_flow(
            session, caller, id, body, request.app.state.registry, request.app.state.secret_box.seal
        )
    return single(service.to_dict(flow))


@router.delete(
    "/flows/{id}",
    response_model=dict[str, Any],
    responses=errors(400, 401, 403, 404, 409),
    summary="Delete an inactive flow",
)
async def delete_flow(id: FlowId, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.FLOWS_DELETE)
    async with db.write() as session:
        await service.delete_flow(session, caller, id)
    return JSONOut({})


def _moving(
    path: str, name: str, expected: FlowStatus, target: FlowStatus, summary: str, description: str = ""
) -> None:
    """``POST path``: the caller's move of a flow from ``expected`` to ``target``
    (``flows.status``); the engine's lifecycle is nudged to complete it."""

    async def endpoint(id: FlowId, request: Request, db: DB, caller: Caller) -> JSONOut:
        service.check_id(id)
        caller.require(perms.FLOWS_UPDATE)
        async with db.write() as session:
            await service.transition(
                session, caller, id, expected=expected, target=target, registry=request.app.state.registry
            )
        _nudge(request)
        return single({"id": id, "status": target})

    endpoint.__name__ = endpoint.__qualname__ = name
    router.post(
        path,
        response_model=Single[FlowStatusChange],
        responses=errors(400, 401, 403, 404, 409),
        summary=summary,
        description=description,
    )(endpoint)


_moving(
    "/flows/{id}/start",
    "start_flow",
    FlowStatus.INACTIVE,
    FlowStatus.STARTING,
    "Start an inactive flow (inactive → starting → active)",
    "409 when the flow is not inactive, or when it cannot start: each reason (a component no longer "
    "installed, credentials its owners can no longer use) is one entry of `errors`, with its `field`.",
)
_moving(
    "/flows/{id}/stop",
    "stop_flow",
    FlowStatus.ACTIVE,
    FlowStatus.STOPPING,
    "Stop an active flow (active → stopping → inactive)",
)
