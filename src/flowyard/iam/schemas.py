"""IAM request and response schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic.json_schema import SkipJsonSchema

from flowyard.clock import Timestamp, isoformat
from flowyard.iam import permissions as perms
from flowyard.iam.models import Role, Token, User

UserStatus = Literal["ACTIVE", "PENDING", "DISABLED"]
# A PATCH field that may be omitted (unchanged) but not null: documented without null, and a
# null is refused by validation (``_not_null``), so the document and the server agree.
NoNull = SkipJsonSchema[None]


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("may be omitted but not null")
    return value


# Documented as the enumeration, but checked by the service, which names each unknown value.
Permission = Annotated[str, WithJsonSchema({"type": "string", "enum": list(perms.PERMISSIONS)})]


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str = Field(min_length=1, max_length=320)
    password: str = Field(min_length=1, max_length=1024)


class AccessToken(BaseModel):
    token: str
    id: str


class RoleOut(BaseModel):
    id: str
    name: str
    permissions: list[str]
    scope: str | None = None
    createdAt: Timestamp
    updatedAt: Timestamp
    isGlobal: bool
    description: str | None = None


class UserOut(BaseModel):
    id: str
    username: str
    firstname: str
    lastname: str
    status: UserStatus
    tenant: str | None = None
    roles: list[RoleOut]
    permissions: list[str]
    confirmed: bool
    img: str | None = None
    canLogin: bool
    createdAt: Timestamp
    updatedAt: Timestamp


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str = Field(
        min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$", description="An e-mail address."
    )
    password: str = Field(min_length=8, max_length=1024)
    firstname: str = Field("", max_length=200)
    lastname: str = Field("", max_length=200)
    tenant: str | None = None
    permissions: list[Permission] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list, description="Role ids.")
    status: UserStatus = "ACTIVE"
    img: str | None = Field(None, max_length=2000)


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    password: str | NoNull = Field(None, min_length=8, max_length=1024)
    firstname: str | NoNull = Field(None, max_length=200)
    lastname: str | NoNull = Field(None, max_length=200)
    tenant: str | None = None
    permissions: list[Permission] | NoNull = None
    roles: list[str] | NoNull = None
    status: UserStatus | NoNull = None
    img: str | None = Field(None, max_length=2000)
    confirmed: bool | NoNull = None
    currentPassword: str | None = Field(
        None,
        max_length=1024,
        description="Required with password, except when an administrator resets another user's password.",
    )
    keepApiTokens: bool = Field(
        False,
        description="With password: keep the user's API tokens. Its sessions are always revoked "
        "(all but the caller's own when it changes its own password).",
    )

    _refuse_null = field_validator(
        "password", "firstname", "lastname", "permissions", "roles", "status", "confirmed", mode="before"
    )(_not_null)


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)


class TenantOut(BaseModel):
    id: str
    name: str
    createdAt: Timestamp
    updatedAt: Timestamp


class RoleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    permissions: list[Permission] = Field(default_factory=list)
    description: str | None = Field(None, max_length=2000)
    scope: str | None = Field(
        None, description="Tenant id; omitted: the caller's tenant, or global for admins."
    )


class RoleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | NoNull = Field(None, min_length=1, max_length=200)
    permissions: list[Permission] | NoNull = None
    description: str | None = Field(None, max_length=2000)

    _refuse_null = field_validator("name", "permissions", mode="before")(_not_null)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str | None = Field(None, max_length=500)
    expiresAt: datetime | None = Field(None, description="ISO timestamp; omitted: the token does not expire.")
    permissions: list[Permission] | None = Field(
        None,
        description="Narrow the token; omitted: the same as the token that creates it "
        "(all of the user's, unless that token is itself narrowed).",
    )
    user: str | None = Field(None, description="Admins only: create the token for this user id.")


class TokenOut(BaseModel):
    id: str
    description: str | None = None
    kind: Literal["session", "api"]
    permissions: list[str] | None = None
    createdAt: Timestamp
    expiresAt: Timestamp | None = None
    lastUsedAt: Timestamp | None = None
    user: str


class TokenCreated(TokenOut):
    token: str = Field(description="The token text. Shown only in this response.")


class Introspect(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=500)


class IntrospectOut(BaseModel):
    active: bool
    tokenId: str | None = None
    user: UserOut | None = None
    permissions: list[str] = Field(default_factory=list)
    expiresAt: Timestamp | None = None


def _ts(value: datetime | None) -> str | None:
    return isoformat(value) if value is not None else None


def role_dict(role: Role) -> dict[str, Any]:
    return {
        "id": role.id,
        "name": role.name,
        "permissions": list(role.permissions or []),
        "scope": role.scope,
        "createdAt": isoformat(role.created_at),
        "updatedAt": isoformat(role.updated_at),
        "isGlobal": role.is_global,
        "description": role.description,
    }


def user_dict(user: User, roles: list[Role]) -> dict[str, Any]:
    return {
        "id": user.id,
        "username": user.username,
        "firstname": user.firstname,
        "lastname": user.lastname,
        "status": user.status,
        "tenant": user.tenant_id,
        "roles": [role_dict(r) for r in roles],
        "permissions": list(user.permissions or []),
        "confirmed": user.confirmed,
        "img": user.img,
        "canLogin": user.status != "DISABLED" and user.password_hash is not None,
        "createdAt": isoformat(user.created_at),
        "updatedAt": isoformat(user.updated_at),
    }


def token_dict(token: Token) -> dict[str, Any]:
    return {
        "id": token.id,
        "description": token.description,
        "kind": token.kind,
        "permissions": token.permissions,
        "createdAt": isoformat(token.created_at),
        "expiresAt": _ts(token.expires_at),
        "lastUsedAt": _ts(token.last_used_at),
        "user": token.user_id,
    }
