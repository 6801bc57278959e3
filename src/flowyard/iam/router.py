"""HTTP for login, tokens, users, tenants and roles: translation only; the services decide."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.deps import DB, AppSettings, json_body_doc, parse_body
from flowyard.api.docs import errors
from flowyard.api.listing import PageNumber, PageSize, parse_list_query
from flowyard.api.responses import JSONOut, Page, Single, page, single
from flowyard.clock import isoformat
from flowyard.iam import login as login_service
from flowyard.iam import roles as role_service
from flowyard.iam import tenants as tenant_service
from flowyard.iam import tokens as token_service
from flowyard.iam import users as user_service
from flowyard.iam.deps import Caller
from flowyard.iam.principal import Principal
from flowyard.iam.schemas import (
    AccessToken,
    Introspect,
    IntrospectOut,
    Login,
    RoleCreate,
    RoleOut,
    RoleUpdate,
    TenantCreate,
    TenantOut,
    TokenCreate,
    TokenCreated,
    TokenOut,
    UserCreate,
    UserOut,
    UserUpdate,
    role_dict,
    token_dict,
    user_dict,
)
from flowyard.iam.tokens import Lifetimes

router = APIRouter()
ObjectId = Annotated[str, Path(description="24 hex characters.")]


def _tenant_dict(t: Any) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "createdAt": isoformat(t.created_at),
        "updatedAt": isoformat(t.updated_at),
    }


def _paged_list(
    path: str,
    name: str,
    lister: Callable[..., Awaitable[tuple[Sequence[Any], int]]],
    to_dict: Callable[[Any], dict[str, Any]],
    **doc: Any,
) -> None:
    """``GET path``: one page of what ``lister(session, caller, limit=, offset=)`` returns, each
    item through ``to_dict``. ``name`` names the endpoint (the OpenAPI operationId)."""

    async def endpoint(
        request: Request, db: DB, caller: Caller, _size: PageSize = None, _number: PageNumber = None
    ) -> JSONOut:
        lq = parse_list_query(request)
        async with db.read() as session:
            items, total = await lister(session, caller, limit=lq.size, offset=lq.offset)
        return page([to_dict(item) for item in items], page=lq.page, per_page=lq.size, total=total)

    endpoint.__name__ = endpoint.__qualname__ = name
    router.get(path, **doc)(endpoint)


def _creating(
    path: str,
    name: str,
    model: type[BaseModel],
    create: Callable[[AsyncSession, Any, Principal], Awaitable[Any]],
    to_dict: Callable[[Any], dict[str, Any]],
    **doc: Any,
) -> None:
    """``POST path``: the body parsed as ``model``, ``create(session, body, caller)``, the new
    item answered ``201`` through ``to_dict``."""

    async def endpoint(request: Request, db: DB, caller: Caller) -> JSONOut:
        body = await parse_body(request, model)
        async with db.write() as session:
            item = await create(session, body, caller)
        return single(to_dict(item), 201)

    endpoint.__name__ = endpoint.__qualname__ = name
    router.post(path, status_code=201, openapi_extra=json_body_doc(model.__name__), **doc)(endpoint)


def _deleting(
    path: str, name: str, deleter: Callable[[AsyncSession, Principal, str], Awaitable[None]], **doc: Any
) -> None:
    """``DELETE path`` (``{id}`` in it): ``deleter(session, caller, id)``, then every cached
    principal is dropped (what was deleted may have been a token, a user or a role of one)."""

    async def endpoint(id: ObjectId, request: Request, db: DB, caller: Caller) -> JSONOut:
        async with db.write() as session:
            await deleter(session, caller, id)
        request.app.state.principals.clear()
        return JSONOut({})

    endpoint.__name__ = endpoint.__qualname__ = name
    router.delete(path, **doc)(endpoint)


# -- login and tokens -----------------------------------------------------------


@router.post(
    "/login",
    tags=["auth"],
    response_model=AccessToken,
    responses=errors(400, 401, 415, 429),
    openapi_extra=json_body_doc("Login"),
    summary="Log in; returns a session token (throttled per username and client address)",
)
async def login(request: Request, db: DB, settings: AppSettings) -> JSONOut:
    body = await parse_body(request, Login)
    token, text = await login_service.login(
        db,
        body.username,
        body.password,
        # The TCP peer: behind a proxy, the proxy's address unless uvicorn trusts forwarded headers.
        address=request.client.host if request.client else None,
        limits=login_service.Limits.of(settings),
        lifetimes=Lifetimes.of(settings),
    )
    return JSONOut({"token": text, "id": token.id})


@router.post(
    "/logout",
    tags=["auth"],
    response_model=dict[str, Any],
    responses=errors(401),
    summary="Revoke the caller's token",
)
async def logout(request: Request, db: DB, caller: Caller) -> JSONOut:
    async with db.write() as session:
        await token_service.logout(session, caller)
    request.app.state.principals.clear()
    return JSONOut({})


@router.post(
    "/tokens",
    tags=["auth"],
    status_code=201,
    response_model=Single[TokenCreated],
    responses=errors(400, 401, 403, 404, 415),
    openapi_extra=json_body_doc("TokenCreate"),
    summary="Create an API token (the text is shown once)",
)
async def create_token(request: Request, db: DB, caller: Caller) -> JSONOut:
    body = await parse_body(request, TokenCreate)
    async with db.write() as session:
        token, text = await token_service.create_api_token(
            session,
            caller,
            description=body.description,
            expires_at=body.expiresAt,
            permissions=body.permissions,
            user_id=body.user,
        )
    return single({**token_dict(token), "token": text}, 201)


_paged_list(
    "/tokens",
    "list_tokens",
    token_service.list_tokens,
    token_dict,
    tags=["auth"],
    response_model=Page[TokenOut],
    responses=errors(400, 401),
    summary="List the caller's tokens (without their text), paged",
)


_deleting(
    "/tokens/{id}",
    "delete_token",
    token_service.delete_token,
    tags=["auth"],
    response_model=dict[str, Any],
    responses=errors(400, 401, 403, 404),
    summary="Revoke a token",
)


@router.post(
    "/tokens/introspect",
    tags=["auth"],
    response_model=Single[IntrospectOut],
    responses=errors(400, 401, 403, 415),
    openapi_extra=json_body_doc("Introspect"),
    summary="Who owns a token and what it may do",
)
async def introspect(request: Request, db: DB, caller: Caller, settings: AppSettings) -> JSONOut:
    body = await parse_body(request, Introspect)
    async with db.read() as session:
        found = await token_service.introspect(session, caller, body.token, Lifetimes.of(settings))
        if found is None:
            return single({"active": False, "permissions": []})
        token, user, granted = found
        roles = (await role_service.roles_of(session, [user.id]))[user.id]
    return single(
        {
            "active": user.status != "DISABLED",
            "tokenId": token.id,
            "user": user_dict(user, roles),
            "permissions": sorted(granted),
            "expiresAt": token_dict(token)["expiresAt"],
        }
    )


# -- users ---------------------------------------------------------------------


_USERS_DOC: dict[str, Any] = {
    "tags": ["users"],
    "response_model": list[UserOut] | Page[UserOut],
    "responses": errors(400, 401),
    "summary": "List users, paged (a bare array of one page; with meta=true, wrapped in data/meta)",
}
MetaFlag = Annotated[bool, Query(description="Wrap the page in data/meta.")]
UsernameFilter = Annotated[str | None, Query(max_length=320, description="Only the user with this username.")]


@router.get("/users", **_USERS_DOC, include_in_schema=False)
@router.get("/users/", **_USERS_DOC, include_in_schema=False)
@router.get("/api/users", **_USERS_DOC)
async def list_users(
    request: Request,
    db: DB,
    caller: Caller,
    meta: MetaFlag = False,
    username: UsernameFilter = None,
    _size: PageSize = None,
    _number: PageNumber = None,
) -> JSONOut:
    lq = parse_list_query(request)
    async with db.read() as session:
        users, total = await user_service.list_users(
            session, caller, username=username, limit=lq.size, offset=lq.offset
        )
        roles = await role_service.roles_of(session, [u.id for u in users])
    data = [user_dict(u, roles[u.id]) for u in users]
    if meta:
        return page(data, page=lq.page, per_page=lq.size, total=total)
    return JSONOut(data)


@router.get("/users/{id}", tags=["users"], response_model=UserOut, include_in_schema=False)
@router.get(
    "/api/users/{id}",
    tags=["users"],
    response_model=UserOut,
    responses=errors(401, 404),
    summary="Read a user",
)
async def get_user(id: ObjectId, db: DB, caller: Caller) -> JSONOut:
    async with db.read() as session:
        user = await user_service.get_user(session, caller, id)
        roles = (await role_service.roles_of(session, [user.id]))[user.id]
    return JSONOut(user_dict(user, roles))


@router.post(
    "/api/users",
    tags=["users"],
    status_code=201,
    response_model=UserOut,
    responses=errors(400, 401, 403, 409, 415),
    openapi_extra=json_body_doc("UserCreate"),
    summary="Create a user (iam.account.create)",
)
async def create_user(request: Request, db: DB, caller: Caller) -> JSONOut:
    body = await parse_body(request, UserCreate)
    async with db.write() as session:
        user = await user_service.create_user(
            session,
            username=body.username,
            password=body.password,
            firstname=body.firstname,
            lastname=body.lastname,
            tenant_id=body.tenant,
            permissions=body.permissions,
            role_ids=body.roles,
            status=body.status,
            img=body.img,
            principal=caller,
        )
        roles = (await role_service.roles_of(session, [user.id]))[user.id]
    return JSONOut(user_dict(user, roles), status_code=201)


@router.patch(
    "/api/users/{id}",
    tags=["users"],
    response_model=UserOut,
    responses=errors(400, 401, 403, 404, 415, 429),
    openapi_extra=json_body_doc("UserUpdate"),
    summary="Update a user (iam.account.update; anyone may change their own name, password and image). "
    "A new password needs currentPassword (not for an administrator resetting another user's) and "
    "revokes the user's other sessions and its API tokens",
)
async def update_user(
    id: ObjectId, request: Request, db: DB, caller: Caller, settings: AppSettings
) -> JSONOut:
    body = await parse_body(request, UserUpdate)
    user, roles = await user_service.patch_user(
        db,
        caller,
        id,
        body.model_dump(exclude_unset=True, exclude={"currentPassword", "keepApiTokens"}),
        current_password=body.currentPassword,
        keep_api_tokens=body.keepApiTokens,
        limits=login_service.Limits.of(settings),
    )
    request.app.state.principals.clear()
    return JSONOut(user_dict(user, roles))


_deleting(
    "/api/users/{id}",
    "delete_user",
    user_service.delete_user,
    tags=["users"],
    response_model=dict[str, Any],
    responses=errors(401, 403, 404, 409),
    summary="Delete a user (iam.account.delete)",
)


# -- tenants and roles -----------------------------------------------------------


_creating(
    "/tenants",
    "create_tenant",
    TenantCreate,
    lambda session, body, caller: tenant_service.create_tenant(session, body.name, caller),
    _tenant_dict,
    tags=["tenants"],
    response_model=Single[TenantOut],
    responses=errors(400, 401, 403, 409, 415),
    summary="Create a tenant (iam.tenant.create)",
)


_paged_list(
    "/tenants",
    "list_tenants",
    tenant_service.list_tenants,
    _tenant_dict,
    tags=["tenants"],
    response_model=Page[TenantOut],
    responses=errors(400, 401),
    summary="List tenants, paged (all with iam.tenant.read, else the caller's own)",
)


_paged_list(
    "/roles",
    "list_roles",
    role_service.list_roles,
    role_dict,
    tags=["roles"],
    response_model=Page[RoleOut],
    responses=errors(400, 401, 403),
    summary="List roles, paged (tenant.roles.read)",
)


_creating(
    "/roles",
    "create_role",
    RoleCreate,
    lambda session, body, caller: role_service.create_role(
        session,
        name=body.name,
        permissions=body.permissions,
        description=body.description,
        scope=body.scope,
        principal=caller,
    ),
    role_dict,
    tags=["roles"],
    response_model=Single[RoleOut],
    responses=errors(400, 401, 403, 409, 415),
    summary="Create a role (tenant.roles.create in the caller's tenant; all for global roles)",
)


@router.get(
    "/roles/{id}",
    tags=["roles"],
    response_model=Single[RoleOut],
    responses=errors(401, 403, 404),
    summary="Read a role",
)
async def get_role(id: ObjectId, db: DB, caller: Caller) -> JSONOut:
    async with db.read() as session:
        role = await role_service.get_role(session, caller, id)
    return single(role_dict(role))


@router.patch(
    "/roles/{id}",
    tags=["roles"],
    response_model=Single[RoleOut],
    responses=errors(400, 401, 403, 404, 409, 415),
    openapi_extra=json_body_doc("RoleUpdate"),
    summary="Update a role (tenant.roles.update)",
)
async def update_role(id: ObjectId, request: Request, db: DB, caller: Caller) -> JSONOut:
    body = await parse_body(request, RoleUpdate)
    async with db.write() as session:
        role = await role_service.update_role(session, caller, id, body.model_dump(exclude_unset=True))
    request.app.state.principals.clear()
    return single(role_dict(role))


_deleting(
    "/roles/{id}",
    "delete_role",
    role_service.delete_role,
    tags=["roles"],
    response_model=dict[str, Any],
    responses=errors(401, 403, 404),
    summary="Delete a role (tenant.roles.delete)",
)
