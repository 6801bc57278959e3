"""HTTP for flow templates."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from flowyard.api.deps import DB, json_body_doc, read_json
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, Search, parse_list_query
from flowyard.api.responses import JSONOut, Page, Single, page, single
from flowyard.flows import service as flows
from flowyard.flows.schemas import Flow
from flowyard.iam import permissions as perms
from flowyard.iam.deps import Caller
from flowyard.templates import service
from flowyard.templates.schemas import FlowTemplate

router = APIRouter(tags=["templates"])

TemplateId = Annotated[str, Path(description="Template id: 24 hex characters.")]


@router.get(
    "/templates",
    response_model=Page[FlowTemplate],
    responses=errors(400, 401, 403),
    summary="List the flow templates visible to the caller (flowTemplates.read)",
)
async def list_templates(
    request: Request,
    db: DB,
    caller: Caller,
    _size: PageSize = None,
    _number: PageNumber = None,
    _status: Annotated[
        str | None,
        Query(
            alias="filter[status]",
            description="published, draft, or 1 (published), 0 (draft)",
            json_schema_extra={"enum": service.STATUS_FILTER_VALUES},
        ),
    ] = None,
    _user: Annotated[
        str | None,
        Query(
            alias="filter[user]",
            description="Templates owned by this user id; for administrators and users of the same tenant.",
        ),
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
    _tags: Annotated[
        str | None,
        Query(
            alias="tags",
            description="Comma-separated; templates having any of these tags, plus every untagged template.",
        ),
    ] = None,
) -> JSONOut:
    caller.require(perms.TEMPLATES_READ)
    lq = parse_list_query(
        request, filters=service.TEMPLATE_FILTERS, sorts=service.TEMPLATE_SORTS, searchable=True
    )
    tags = service.parse_tags(request.query_params.getlist("tags"))
    async with db.read() as session:
        templates, total = await service.list_templates(session, caller, lq, tags)
    return page([service.to_dict(t) for t in templates], page=lq.page, per_page=lq.size, total=total)


@router.get(
    "/templates/{id}",
    response_model=Single[FlowTemplate],
    responses=errors(400, 401, 403, 404),
    summary="Read a flow template (flowTemplates.read)",
)
async def get_template(id: TemplateId, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.TEMPLATES_READ)
    async with db.read() as session:
        template = await service.get_template(session, caller, id)
    return single(service.to_dict(template))


@router.post(
    "/templates",
    status_code=201,
    response_model=Single[FlowTemplate],
    responses=errors(400, 401, 403, 413, 415),
    openapi_extra=json_body_doc("MutableFlowTemplate"),
    summary="Create a flow template (administrators: all)",
)
async def create_template(request: Request, db: DB, caller: Caller) -> JSONOut:
    caller.require(perms.ALL)
    body = await read_json(request)
    async with db.write() as session:
        template = await service.create_template(session, caller, body, request.app.state.registry)
    return single(service.to_dict(template), 201)


@router.patch(
    "/templates/{id}",
    response_model=Single[FlowTemplate],
    responses=errors(400, 401, 403, 404, 413, 415),
    openapi_extra=json_body_doc("MutableFlowTemplatePatch"),
    summary="Update a flow template (administrators: all)",
)
async def patch_template(id: TemplateId, request: Request, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.ALL)
    body = await read_json(request)
    async with db.write() as session:
        template = await service.update_template(session, caller, id, body, request.app.state.registry)
    return single(service.to_dict(template))


@router.delete(
    "/templates/{id}",
    response_model=dict[str, Any],
    responses=errors(400, 401, 403, 404),
    summary="Delete a flow template (administrators: all)",
)
async def delete_template(id: TemplateId, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.ALL)
    async with db.write() as session:
        await service.delete_template(session, caller, id)
    return JSONOut({})


@router.post(
    "/templates/{id}/flows",
    status_code=201,
    response_model=Single[Flow],
    responses=errors(400, 401, 403, 404, 413, 415),
    openapi_extra=json_body_doc("FlowFromTemplate", required=False, null_too=True),
    summary="Create an inactive flow from a template (flowTemplates.read and tenant.flows.create)",
)
async def create_flow(id: TemplateId, request: Request, db: DB, caller: Caller) -> JSONOut:
    service.check_id(id)
    caller.require(perms.TEMPLATES_READ, perms.FLOWS_CREATE)
    body = await read_json(request, required=False)
    async with db.write() as session:
        flow = await service.create_flow_from_template(session, caller, id, body, request.app.state.registry)
    return single(flows.to_dict(flow), 201)
