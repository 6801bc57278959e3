"""HTTP for secrets (component credentials)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from flowyard.api.deps import DB, json_body_doc, parse_body
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, parse_list_query
from flowyard.api.responses import JSONOut, Page, Single, page, single
from flowyard.iam.deps import Caller
from flowyard.secrets import service
from flowyard.secrets.schemas import SecretCreate, SecretOut, SecretRotate

router = APIRouter(tags=["secrets"])


@router.post(
    "/secrets",
    status_code=201,
    response_model=Single[SecretOut],
    responses=errors(400, 401, 403, 413, 415),
    openapi_extra=json_body_doc("SecretCreate"),
    summary="Store credentials for nodes' credentials_id (iam.secret.create); the value is never returned",
)
async def create_secret(request: Request, db: DB, caller: Caller) -> JSONOut:
    body = await parse_body(request, SecretCreate)
    async with db.write() as session:
        secret = await service.create(
            session,
            caller,
            request.app.state.secret_box,
            name=body.name,
            value=body.value,
            tenant=body.tenant,
        )
    return single(service.to_dict(secret), 201)


@router.get(
    "/secrets",
    response_model=Page[SecretOut],
    responses=errors(400, 401, 403),
    summary="List stored secrets without their values, paged (iam.secret.read)",
)
async def list_secrets(
    request: Request, db: DB, caller: Caller, _size: PageSize = None, _number: PageNumber = None
) -> JSONOut:
    lq = parse_list_query(request)
    async with db.read() as session:
        secrets, total = await service.list_secrets(session, caller, limit=lq.size, offset=lq.offset)
    return page([service.to_dict(s) for s in secrets], page=lq.page, per_page=lq.size, total=total)


@router.put(
    "/secrets/{id}",
    response_model=Single[SecretOut],
    responses=errors(400, 401, 403, 404, 413, 415),
    openapi_extra=json_body_doc("SecretRotate"),
    summary="Rotate a secret: a new value under the same id (iam.secret.create); never returned",
)
async def rotate_secret(
    id: Annotated[str, Path(description="Secret id.")], request: Request, db: DB, caller: Caller
) -> JSONOut:
    body = await parse_body(request, SecretRotate)
    async with db.write() as session:
        secret = await service.rotate(session, caller, request.app.state.secret_box, id, value=body.value)
    return single(service.to_dict(secret))


@router.delete(
    "/secrets/{id}",
    response_model=dict[str, Any],
    responses=errors(400, 401, 403, 404),
    summary="Delete a secret (iam.secret.create)",
)
async def delete_secret(
    id: Annotated[str, Path(description="Secret id.")], db: DB, caller: Caller
) -> JSONOut:
    async with db.write() as session:
        await service.delete(session, caller, id)
    return JSONOut({})
