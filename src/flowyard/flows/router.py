"""HTTP for flows."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from flowyard.api.deps import DB, is_json_content_type, json_body_doc, read_json
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, Search, parse_list_query
from flowyard.api.responses import HistoryPage, JSONOut, Page, Single, history_page, page, single
from flowyard.errors import FlowyardError, InvalidInput, UnsupportedMediaType, error_body
from flowyard.flows import service
from flowyard.flows.schemas import Flow, FlowDocument, FlowStatusChange, FlowVersion, FlowVersionSummary
from flowyard.flows.status import FlowStatus
from flowyard.iam.deps import Caller

router = APIRouter(tags=["flows"])

FlowId = Annotated[str, Path(description="Flow id: 24 hex characters.")]


VersionNumber = Annotated[str, Path(description="Version number: a positive integer.")]


def _number(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10:
        raise InvalidInput("The version must be a positive integer.", field="number")
    return int(raw)


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
        service.require_create(caller)
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


@router.post(
    "/flows/import",
    status_code=201,
    response_model=Single[Flow],
    responses=errors(400, 401, 403, 413, 415),
    openapi_extra=json_body_doc("FlowDocument"),
    summary="Create a flow from a portable document (GET /flows/{id}/export)",
    description="400 lists every problem of the document (too big or too deep, fields a document "
    "never carries, a secret such as webhookSecret or credential values, a component not installed "
    "here, a credentials_name with no usable secret of that name); nothing is stored then.",
)
async def import_flow(request: Request, db: DB, caller: Caller) -> JSONOut:
    if not is_json_content_type(request.headers.get("content-type")):
        raise UnsupportedMediaType()
    raw = await request.body()
    async with db.write() as session:
        flow = await service.import_flow(session, caller, raw, request.app.state.registry)
    return single(service.to_dict(flow), 201)


@router.get(
    "/flows/{id}/export",
    response_model=Single[FlowDocument],
    responses=errors(400, 401, 403, 404),
    summary="A flow as a portable document: no ids, owners or secrets; credentials by name",
)
async def export_flow(id: FlowId, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    async with db.read() as session:
        return single(await service.export_flow(session, caller, id))


@router.get(
    "/flows",
    response_model=HistoryPage[Flow],
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
    lq = parse_list_query(request, filters=service.FLOW_FILTERS, sorts=service.FLOW_SORTS, searchable=True)
    listed = await service.list_flows(db, caller, lq)
    flows = [service.to_dict(f) for f in listed.rows]
    return history_page(flows, page=lq.page, per_page=lq.size, total=listed.total, exact=listed.exact)


@router.get(
    "/flows/{id}", response_model=Single[Flow], responses=errors(400, 401, 403, 404), summary="Read a flow"
)
async def get_flow(id: FlowId, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    return single(await service.read_flow(db, caller, id))


@router.patch(
    "/flows/{id}",
    response_model=Single[Flow],
    responses=errors(400, 401, 403, 404, 409, 413, 415),
    openapi_extra=json_body_doc("MutableFlowPatch"),
    summary="Update an inactive or active flow (an active one: for executions accepted afterwards)",
)
async def patch_flow(id: FlowId, request: Request, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
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


@router.get(
    "/flows/{id}/versions",
    response_model=Page[FlowVersionSummary],
    responses=errors(400, 401, 403, 404),
    summary="List a flow's versions, newest first",
)
async def list_versions(
    id: FlowId, request: Request, db: DB, caller: Caller, _size: PageSize = None, _number: PageNumber = None
) -> JSONOut:
    service.check_id(id)
    lq = parse_list_query(request)
    async with db.read() as session:
        rows, total = await service.list_versions(session, caller, id, limit=lq.size, offset=lq.offset)
    return page(rows, page=lq.page, per_page=lq.size, total=total)


@router.get(
    "/flows/{id}/versions/{number}",
    response_model=Single[FlowVersion],
    responses=errors(400, 401, 403, 404),
    summary="Read one version of a flow",
)
async def get_version(id: FlowId, number: VersionNumber, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    n = _number(number)
    async with db.read() as session:
        return single(await service.read_version(session, caller, id, n))


@router.post(
    "/flows/{id}/versions/{number}/restore",
    response_model=Single[Flow],
    responses=errors(400, 401, 403, 404, 409),
    summary="Make a new version equal to an earlier one (the flow must be inactive or active)",
)
async def restore_version(
    id: FlowId, number: VersionNumber, request: Request, db: DB, caller: Caller
) -> JSONOut:
    service.check_id(id)
    n = _number(number)
    async with db.write() as session:
        flow = await service.restore_version(session, caller, id, n, request.app.state.registry)
    return single(service.to_dict(flow))
