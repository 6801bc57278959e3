"""Accounts, tenants, roles, passwords and tokens. No HTTP here."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import as_utc, utcnow
from flowyard.errors import Conflict, Forbidden, InvalidInput, NotFound, Problem, Unauthorized
from flowyard.iam import permissions as perms
from flowyard.iam.models import Role, Tenant, Token, User, UserRole
from flowyard.iam.principal import Principal
from flowyard.ids import is_valid_id

log = logging.getLogger(__name__)

_hasher = PasswordHasher()  # argon2id with the library's current recommended cost
# Verified against when the username is unknown, so both failures take as long.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))
USER_STATUSES = ("ACTIVE", "PENDING", "DISABLED")
_BAD_LOGIN = "Wrong username or password."
# Sliding expiry is written back at most this often per token, not on every request.
_SLIDE_GRANULARITY = timedelta(seconds=60)


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token_text() -> str:
    return "fy_" + secrets.token_urlsafe(32)  # 256 bits


def check_id(value: str, what: str) -> None:
    """A malformed id is a bad request (400), not an unknown object (404)."""
    if not is_valid_id(value):
        raise InvalidInput(f"Invalid {what} id {value[:64]!r}: expected 24 hex characters.", field="id")


def narrow(granted: frozenset[str], token_permissions: list[str] | None) -> frozenset[str]:
    """What a token may do: its listed permissions that its user holds.

    Matched by implication, not by set intersection, so a token narrowed to
    ``tenant.flows.read`` works for a user who holds it through ``all`` or
    ``tenant.all``.
    """
    if token_permissions is None:
        return granted
    return frozenset(p for p in token_permissions if perms.implied(granted, p))


def check_permissions(values: Iterable[str], field: str = "permissions") -> list[str]:
    out: list[str] = []
    problems = []
    for i, value in enumerate(values):
        if value not in perms.KNOWN:
            problems.append(Problem(f"Unknown permission {value!r}.", f"{field}[{i}]"))
        elif value not in out:
            out.append(value)
    if problems:
        raise InvalidInput(problems)
    return out


# -- principals and tokens ------------------------------------------------------


async def effective_permissions(session: AsyncSession, user: User) -> frozenset[str]:
    rows = await session.scalars(
        sa.select(Role.permissions)
        .join(UserRole, UserRole.role_id == Role.id)
        .where(UserRole.user_id == user.id)
    )
    granted = set(user.permissions or [])
    for role_perms in rows:
        granted.update(role_perms or [])
    return frozenset(granted)


async def authenticate(
    session: AsyncSession, token_text: str, *, session_ttl: float
) -> tuple[Principal, bool]:
    """Resolve a bearer token. The flag says a session token's expiry should slide."""
    now = utcnow()
    row = (
        await session.execute(
            sa.select(Token, User)
            .join(User, User.id == Token.user_id)
            .where(Token.token_hash == hash_token(token_text))
        )
    ).first()
    if row is None:
        raise Unauthorized()
    token, user = row
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthorized("Token expired.")
    if user.status == "DISABLED":
        raise Unauthorized("Account disabled.")
    slide = token.kind == "session" and (
        token.expires_at is None
        or now + timedelta(seconds=session_ttl) - token.expires_at > _SLIDE_GRANULARITY
    )
    granted = narrow(await effective_permissions(session, user), token.permissions)
    return Principal(user.id, user.username, user.tenant_id, granted, token.id), slide


async def slide_session(session: AsyncSession, token_id: str, *, session_ttl: float) -> None:
    now = utcnow()
    await session.execute(
        sa.update(Token)
        .where(Token.id == token_id)
        .values(expires_at=now + timedelta(seconds=session_ttl), last_used_at=now)
    )


async def login_candidate(session: AsyncSession, username: str) -> User | None:
    return await session.scalar(sa.select(User).where(User.username == username.strip().lower()))


async def check_password(user: User | None, password: str) -> bool:
    """Verify off the event loop (argon2 takes tens of ms); unknown users cost the same."""
    ok = await asyncio.to_thread(verify_password, user.password_hash if user else None, password)
    return ok and user is not None and user.status != "DISABLED"


async def record_failed_login(session: AsyncSession, user_id: str) -> None:
    await session.execute(
        sa.update(User).where(User.id == user_id).values(failed_login_attempts=User.failed_login_attempts + 1)
    )


async def open_session(session: AsyncSession, user_id: str, *, session_ttl: float) -> tuple[Token, str]:
    """Issue a session token after a successful password check."""
    user = await session.get(User, user_id)
    if user is None or user.status == "DISABLED":
        raise Unauthorized(_BAD_LOGIN)
    now = utcnow()
    user.failed_login_attempts = 0
    user.last_login = now
    return await _issue_token(session, user, kind="session", expires_at=now + timedelta(seconds=session_ttl))


def bad_login() -> Unauthorized:
    return Unauthorized(_BAD_LOGIN)


async def _issue_token(
    session: AsyncSession,
    user: User,
    *,
    kind: str,
    expires_at: datetime | None,
    description: str | None = None,
    permissions: list[str] | None = None,
) -> tuple[Token, str]:
    text = _new_token_text()
    token = Token(
        user_id=user.id,
        token_hash=hash_token(text),
        kind=kind,
        description=description,
        permissions=permissions,
        created_at=utcnow(),
        expires_at=expires_at,
    )
    session.add(token)
    await session.flush()
    return token, text


async def logout(session: AsyncSession, principal: Principal) -> None:
    await session.execute(sa.delete(Token).where(Token.id == principal.token_id))


async def create_api_token(
    session: AsyncSession,
    principal: Principal,
    *,
    description: str | None,
    expires_at: datetime | None,
    permissions: list[str] | None,
    user_id: str | None = None,
) -> tuple[Token, str]:
    """An API token for the caller (or, for an admin, another user)."""
    owner_id = user_id or principal.user_id
    if owner_id != principal.user_id and not principal.is_admin:
        raise Forbidden("Only an administrator can create tokens for other users.")
    user = await session.get(User, owner_id)
    if user is None:
        raise NotFound(f"User {owner_id} not found.")
    if expires_at is not None:
        # A timestamp without a zone is taken as UTC rather than failing to compare.
        expires_at = as_utc(expires_at)
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidInput("expiresAt must be in the future.", field="expiresAt")
    if permissions is not None:
        permissions = check_permissions(permissions)
        # A token's permissions are never more than its user's.
        held = await effective_permissions(session, user)
        if owner_id == principal.user_id:
            held = held & principal.permissions
        excess = [p for p in permissions if not perms.implied(held, p)]
        if excess:
            raise Forbidden(f"The token cannot have permissions its user lacks: {', '.join(excess)}.")
    return await _issue_token(
        session, user, kind="api", expires_at=expires_at, description=description, permissions=permissions
    )


async def list_tokens(session: AsyncSession, principal: Principal) -> Sequence[Token]:
    return (
        await session.scalars(sa.select(Token).where(Token.user_id == principal.user_id).order_by(Token.id))
    ).all()


async def delete_token(session: AsyncSession, principal: Principal, token_id: str) -> None:
    check_id(token_id, "token")
    token = await session.get(Token, token_id)
    if token is None or (token.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"Token {token_id} not found.")
    await session.delete(token)


async def introspect(session: AsyncSession, token_text: str) -> tuple[Token, User, frozenset[str]] | None:
    row = (
        await session.execute(
            sa.select(Token, User)
            .join(User, User.id == Token.user_id)
            .where(Token.token_hash == hash_token(token_text))
        )
    ).first()
    if row is None:
        return None
    token, user = row
    if token.expires_at is not None and token.expires_at <= utcnow():
        return None
    granted = narrow(await effective_permissions(session, user), token.permissions)
    return token, user, granted


# -- users --------------------------------------------------------------------


def user_visible(principal: Principal, user: User) -> bool:
    if principal.can(perms.ACCOUNT_READ) or user.id == principal.user_id:
        return True
    return principal.tenant_id is not None and user.tenant_id == principal.tenant_id


def visible_users_clause(principal: Principal) -> sa.ColumnElement[bool]:
    if principal.can(perms.ACCOUNT_READ):
        return sa.true()
    if principal.tenant_id:
        return sa.or_(User.tenant_id == principal.tenant_id, User.id == principal.user_id)
    return User.id == principal.user_id


async def get_user(session: AsyncSession, principal: Principal, user_id: str) -> User:
    check_id(user_id, "user")
    user = await session.get(User, user_id)
    if user is None or not user_visible(principal, user):
        raise NotFound(f"User {user_id} not found.")
    return user


async def roles_of(session: AsyncSession, user_ids: Sequence[str]) -> dict[str, list[Role]]:
    out: dict[str, list[Role]] = {uid: [] for uid in user_ids}
    if not user_ids:
        return out
    rows = await session.execute(
        sa.select(UserRole.user_id, Role)
        .join(Role, Role.id == UserRole.role_id)
        .where(UserRole.user_id.in_(user_ids))
        .order_by(Role.id)
    )
    for user_id, role in rows:
        out[user_id].append(role)
    return out


async def list_users(
    session: AsyncSession,
    principal: Principal,
    *,
    username: str | None,
    limit: int | None,
    offset: int,
) -> tuple[Sequence[User], int]:
    where = [visible_users_clause(principal)]
    if username:
        where.append(User.username == username.strip().lower())
    total = await session.scalar(sa.select(sa.func.count()).select_from(User).where(*where)) or 0
    query = sa.select(User).where(*where).order_by(User.id).offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return (await session.scalars(query)).all(), total


async def _check_tenant(session: AsyncSession, tenant_id: str | None) -> None:
    if tenant_id is not None and (not is_valid_id(tenant_id) or await session.get(Tenant, tenant_id) is None):
        raise InvalidInput(f"Tenant {tenant_id} does not exist.", field="tenant")


async def _check_roles(session: AsyncSession, role_ids: Sequence[str], tenant_id: str | None) -> list[Role]:
    roles = []
    for i, role_id in enumerate(role_ids):
        role = await session.get(Role, role_id) if is_valid_id(role_id) else None
        if role is None or (not role.is_global and role.scope != tenant_id):
            raise InvalidInput(f"Role {role_id} does not exist in the user's tenant.", field=f"roles[{i}]")
        roles.append(role)
    return roles


def _require_grantable(principal: Principal, permissions: Sequence[str]) -> None:
    if principal.is_admin:
        return
    excess = [p for p in permissions if not principal.can(p)]
    if excess:
        raise Forbidden(f"You cannot grant permissions you lack: {', '.join(excess)}.")


async def create_user(
    session: AsyncSession,
    *,
    username: str,
    password: str | None,
    firstname: str = "",
    lastname: str = "",
    tenant_id: str | None = None,
    permissions: Sequence[str] = (),
    role_ids: Sequence[str] = (),
    status: str = "ACTIVE",
    img: str | None = None,
    principal: Principal | None = None,
) -> User:
    """Create an account. ``principal`` is None for the CLI and first start."""
    username = username.strip().lower()
    perm_list = check_permissions(permissions)
    if principal is not None:
        principal.require(perms.ACCOUNT_CREATE)
        if not principal.is_admin and tenant_id != principal.tenant_id:
            raise Forbidden("You can only create users in your own tenant.")
        _require_grantable(principal, perm_list)
    if status not in USER_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(USER_STATUSES)}.", field="status")
    await _check_tenant(session, tenant_id)
    roles = await _check_roles(session, role_ids, tenant_id)
    if await session.scalar(sa.select(User.id).where(User.username == username)):
        raise Conflict(f"A user named {username} already exists.")
    now = utcnow()
    user = User(
        username=username,
        firstname=firstname,
        lastname=lastname,
        password_hash=hash_password(password) if password else None,
        status=status,
        tenant_id=tenant_id,
        permissions=perm_list,
        img=img,
        created_at=now,
        updated_at=now,
    )
    session.add(user)
    await session.flush()
    for role in roles:
        session.add(UserRole(user_id=user.id, role_id=role.id))
    await session.flush()
    return user


async def update_user(
    session: AsyncSession, principal: Principal, user_id: str, changes: dict[str, object]
) -> User:
    user = await get_user(session, principal, user_id)
    not_nullable = ("password", "firstname", "lastname", "permissions", "roles", "status", "confirmed")
    nulls = [
        Problem(f"{name}: must not be null", name)
        for name in not_nullable
        if name in changes and changes[name] is None
    ]
    if nulls:
        raise InvalidInput(nulls)
    self_edit = user.id == principal.user_id and set(changes) <= {"firstname", "lastname", "password", "img"}
    if not self_edit:
        principal.require(perms.ACCOUNT_UPDATE)
        if not principal.is_admin and user.tenant_id != principal.tenant_id:
            raise NotFound(f"User {user_id} not found.")
    if "permissions" in changes:
        new_perms = check_permissions(changes["permissions"])  # type: ignore[arg-type]
        _require_grantable(principal, new_perms)
        user.permissions = new_perms
    if "tenant" in changes:
        if not principal.is_admin:
            raise Forbidden("Only an administrator can move a user to another tenant.")
        await _check_tenant(session, changes["tenant"])  # type: ignore[arg-type]
        user.tenant_id = changes["tenant"]  # type: ignore[assignment]
    if "roles" in changes:
        roles = await _check_roles(session, changes["roles"], user.tenant_id)  # type: ignore[arg-type]
        await session.execute(sa.delete(UserRole).where(UserRole.user_id == user.id))
        for role in roles:
            session.add(UserRole(user_id=user.id, role_id=role.id))
    if "status" in changes:
        if changes["status"] not in USER_STATUSES:
            raise InvalidInput(f"status must be one of {', '.join(USER_STATUSES)}.", field="status")
        user.status = changes["status"]
        if user.status == "DISABLED":
            await session.execute(sa.delete(Token).where(Token.user_id == user.id))
    if "password" in changes:
        user.password_hash = hash_password(changes["password"])  # type: ignore[arg-type]
    for name in ("firstname", "lastname", "img", "confirmed"):
        if name in changes:
            setattr(user, name, changes[name])
    user.updated_at = utcnow()
    await session.flush()
    return user


async def delete_user(session: AsyncSession, principal: Principal, user_id: str) -> None:
    user = await get_user(session, principal, user_id)
    principal.require(perms.ACCOUNT_DELETE)
    if not principal.is_admin and user.tenant_id != principal.tenant_id:
        raise NotFound(f"User {user_id} not found.")
    if user.id == principal.user_id:
        raise Conflict("You cannot delete your own account.")
    await session.delete(user)


async def set_user_status(session: AsyncSession, username: str, status: str) -> User:
    user = await session.scalar(sa.select(User).where(User.username == username.strip().lower()))
    if user is None:
        raise NotFound(f"User {username} not found.")
    user.status = status
    user.updated_at = utcnow()
    if status == "DISABLED":
        await session.execute(sa.delete(Token).where(Token.user_id == user.id))
    return user


async def user_by_username(session: AsyncSession, username: str) -> User:
    user = await session.scalar(sa.select(User).where(User.username == username.strip().lower()))
    if user is None:
        raise NotFound(f"User {username} not found.")
    return user


# -- tenants and roles ----------------------------------------------------------


async def create_tenant(session: AsyncSession, name: str, principal: Principal | None = None) -> Tenant:
    if principal is not None:
        principal.require(perms.TENANT_CREATE)
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidInput("name must be 1 to 200 characters.", field="name")
    if await session.scalar(sa.select(Tenant.id).where(Tenant.name == name)):
        raise Conflict(f"A tenant named {name} already exists.")
    now = utcnow()
    tenant = Tenant(name=name, created_at=now, updated_at=now)
    session.add(tenant)
    await session.flush()
    return tenant


async def tenant_by_ref(session: AsyncSession, ref: str) -> Tenant:
    """A tenant by id or by name (the CLI takes either)."""
    tenant = await session.get(Tenant, ref) if is_valid_id(ref) else None
    tenant = tenant or await session.scalar(sa.select(Tenant).where(Tenant.name == ref))
    if tenant is None:
        raise NotFound(f"Tenant {ref} not found.")
    return tenant


async def list_tenants(session: AsyncSession, principal: Principal) -> Sequence[Tenant]:
    query = sa.select(Tenant).order_by(Tenant.id)
    if not principal.can(perms.TENANT_READ):
        if not principal.tenant_id:
            return []
        query = query.where(Tenant.id == principal.tenant_id)
    return (await session.scalars(query)).all()


async def create_role(
    session: AsyncSession,
    *,
    name: str,
    permissions: Sequence[str],
    description: str | None = None,
    scope: str | None = None,
    principal: Principal | None = None,
) -> Role:
    """A role in a tenant (``scope``), or a global one (admins and the CLI only)."""
    perm_list = check_permissions(permissions)
    if principal is not None:
        principal.require(perms.ROLES_CREATE)
        if not principal.is_admin:
            if scope is not None and scope != principal.tenant_id:
                raise Forbidden("You can only create roles in your own tenant.")
            scope = principal.tenant_id
            if scope is None:
                raise Forbidden("Only an administrator can create global roles.")
            _require_grantable(principal, perm_list)
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidInput("name must be 1 to 200 characters.", field="name")
    await _check_tenant(session, scope)
    exists = await session.scalar(
        sa.select(Role.id).where(
            Role.name == name, Role.scope.is_(None) if scope is None else Role.scope == scope
        )
    )
    if exists:
        raise Conflict(f"A role named {name} already exists there.")
    now = utcnow()
    role = Role(
        name=name,
        description=description,
        permissions=perm_list,
        scope=scope,
        is_global=scope is None,
        created_at=now,
        updated_at=now,
    )
    session.add(role)
    await session.flush()
    return role


def role_visible(principal: Principal, role: Role) -> bool:
    return (
        principal.is_admin
        or role.is_global
        or (principal.tenant_id is not None and role.scope == principal.tenant_id)
    )


async def list_roles(session: AsyncSession, principal: Principal) -> Sequence[Role]:
    principal.require(perms.ROLES_READ)
    query = sa.select(Role).order_by(Role.id)
    if not principal.is_admin:
        query = query.where(sa.or_(Role.is_global.is_(True), Role.scope == principal.tenant_id))
    return (await session.scalars(query)).all()


async def get_role(session: AsyncSession, principal: Principal, role_id: str) -> Role:
    principal.require(perms.ROLES_READ)
    check_id(role_id, "role")
    role = await session.get(Role, role_id)
    if role is None or not role_visible(principal, role):
        raise NotFound(f"Role {role_id} not found.")
    return role


async def update_role(
    session: AsyncSession, principal: Principal, role_id: str, changes: dict[str, object]
) -> Role:
    role = await get_role(session, principal, role_id)
    principal.require(perms.ROLES_UPDATE)
    if role.is_global and not principal.is_admin:
        raise Forbidden("Only an administrator can change global roles.")
    if "permissions" in changes:
        new_perms = check_permissions(changes["permissions"])  # type: ignore[arg-type]
        _require_grantable(principal, new_perms)
        role.permissions = new_perms
    if "name" in changes:
        name = str(changes["name"] or "").strip()
        if not name or len(name) > 200:
            raise InvalidInput("name must be 1 to 200 characters.", field="name")
        role.name = name
    if "description" in changes:
        role.description = changes["description"]  # type: ignore[assignment]
    role.updated_at = utcnow()
    await session.flush()
    return role


async def delete_role(session: AsyncSession, principal: Principal, role_id: str) -> None:
    role = await get_role(session, principal, role_id)
    principal.require(perms.ROLES_DELETE)
    if role.is_global and not principal.is_admin:
        raise Forbidden("Only an administrator can delete global roles.")
    await session.delete(role)


# -- first start -----------------------------------------------------------------


def _write_password_file(data_dir: Path, username: str, password: str) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "initial-admin-password"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # An older file keeps its mode on O_CREAT; narrow it before the secret is written.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"username: {username}\npassword: {password}\n")
    return path


async def ensure_first_admin(
    session: AsyncSession, *, username: str | None, password: str | None, data_dir: Path
) -> str | None:
    """Create the first administrator when no user exists. Returns its username."""
    if await session.scalar(sa.select(sa.func.count()).select_from(User)):
        return None
    username = (username or "admin@flowyard.local").strip().lower()
    if not password:
        password = secrets.token_urlsafe(18)
        path = await asyncio.to_thread(_write_password_file, data_dir, username, password)
        log.warning("created administrator %s; its generated password is in %s", username, path)
    else:
        log.info("created administrator %s from FLOWYARD_ADMIN_USERNAME/PASSWORD", username)
    await create_user(
        session, username=username, password=password, firstname="Admin", lastname="", permissions=[perms.ALL]
    )
    return username
