"""User accounts: create, read, list, update (grants, passwords, status), delete. No HTTP here.

Who may do what is asked of ``policy``; this module only applies the answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import id_page
from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.errors import Conflict, Forbidden, InvalidInput, NotFound, Problem
from flowyard.iam import permissions as perms
from flowyard.iam import policy
from flowyard.iam.login import Limits, check_current_password
from flowyard.iam.models import Role, User, UserRole
from flowyard.iam.passwords import hash_off_loop
from flowyard.iam.policy import Action
from flowyard.iam.principal import Principal
from flowyard.iam.roles import assignable, effective_permissions, roles_of
from flowyard.iam.tenants import require_exists
from flowyard.iam.tokens import revoke_user_tokens
from flowyard.ids import check_id

USER_STATUSES = ("ACTIVE", "PENDING", "DISABLED")
_NOT_NULLABLE = ("password", "firstname", "lastname", "permissions", "roles", "status", "confirmed")


def _visible_clause(principal: Principal) -> sa.ColumnElement[bool]:
    if policy.sees_every_user(principal):
        return sa.true()
    if principal.tenant_id:
        return sa.or_(User.tenant_id == principal.tenant_id, User.id == principal.user_id)
    return User.id == principal.user_id


async def get_user(session: AsyncSession, principal: Principal, user_id: str) -> User:
    check_id(user_id, "user")
    user = await session.get(User, user_id)
    if user is None or not policy.user_visible(principal, user.id, user.tenant_id):
        raise NotFound(f"User {user_id} not found.")
    return user


async def list_users(
    session: AsyncSession, principal: Principal, *, username: str | None, limit: int, offset: int
) -> tuple[Sequence[User], int]:
    where = [_visible_clause(principal)]
    if username:
        where.append(User.username == username.strip().lower())
    return await id_page(session, User, *where, limit=limit, offset=offset)


def _check_status(status: object) -> str:
    if status not in USER_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(USER_STATUSES)}.", field="status")
    return str(status)


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
    """Create an account. ``principal`` is None for the CLI and first start.

    Over the API an omitted tenant means the caller's own.
    """
    username = username.strip().lower()
    perm_list = perms.validate(permissions)
    if principal is not None:
        policy.require(principal, Action.USER_CREATE)
        if tenant_id is None:
            tenant_id = principal.tenant_id
        policy.require_own_tenant_for_create(principal, tenant_id)
    _check_status(status)
    await require_exists(session, tenant_id)
    roles = await assignable(session, role_ids, tenant_id)
    if principal is not None:
        policy.require_grantable(principal, perm_list, roles)
    if await session.scalar(sa.select(User.id).where(User.username == username)):
        raise Conflict(f"A user named {username} already exists.")
    now = utcnow()
    user = User(
        username=username,
        firstname=firstname,
        lastname=lastname,
        password_hash=await hash_off_loop(password) if password else None,
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


async def _require_may_act(session: AsyncSession, principal: Principal, user: User) -> None:
    is_admin = perms.ALL in await effective_permissions(session, user)
    if not policy.may_act_on_user(principal, user.id, user.tenant_id, is_admin):
        raise Forbidden("You can only manage the non-administrator users of your own tenant.")


async def _set_roles(session: AsyncSession, user: User, roles: Sequence[Role]) -> None:
    await session.execute(sa.delete(UserRole).where(UserRole.user_id == user.id))
    for role in roles:
        session.add(UserRole(user_id=user.id, role_id=role.id))


async def _authorize_update(
    session: AsyncSession, principal: Principal, user_id: str, changes: dict[str, object]
) -> User:
    """The user to change, once the caller may make these changes (all but the grant check)."""
    user = await get_user(session, principal, user_id)
    nulls = [
        Problem(f"{name}: must not be null", name)
        for name in _NOT_NULLABLE
        if name in changes and changes[name] is None
    ]
    if nulls:
        raise InvalidInput(nulls)
    action = policy.user_update_action(principal, user.id, changes)
    if action is not None:
        policy.require(principal, action)
        await _require_may_act(session, principal, user)
    if "tenant" in changes:
        policy.require(principal, Action.USER_MOVE_TENANT)
    return user


async def patch_user(
    db: Database,
    principal: Principal,
    user_id: str,
    changes: dict[str, object],
    *,
    current_password: str | None,
    keep_api_tokens: bool,
    limits: Limits,
) -> tuple[User, list[Role]]:
    """``PATCH /api/users/{id}``: the caller's right to the change is settled first, then the
    current password (throttled like a login), then the change in one transaction."""
    verified = False
    if "password" in changes:
        async with db.read() as session:
            user = await _authorize_update(session, principal, user_id, changes)
        if policy.password_change_needs_current(principal, user.id):
            if not current_password:
                raise InvalidInput(
                    "currentPassword is required to change a password.", field="currentPassword"
                )
            if not await check_current_password(db, user, current_password, limits=limits):
                raise Forbidden("The current password is wrong.")
            verified = True
    async with db.write() as session:
        user = await update_user(
            session,
            principal,
            user_id,
            changes,
            current_password_verified=verified,
            keep_api_tokens=keep_api_tokens,
        )
        return user, (await roles_of(session, [user.id]))[user.id]


async def update_user(
    session: AsyncSession,
    principal: Principal,
    user_id: str,
    changes: dict[str, object],
    *,
    current_password_verified: bool = False,
    keep_api_tokens: bool = False,
) -> User:
    """Apply a user update in one transaction (``patch_user`` checks the current password).

    A new password needs the current one verified (except an administrator resetting
    another user's) and revokes the user's sessions and API tokens (API tokens kept with
    ``keep_api_tokens``), all but the caller's own token when it changes its own.
    """
    user = await _authorize_update(session, principal, user_id, changes)
    if "tenant" in changes:
        new_tenant = changes["tenant"]
        await require_exists(session, new_tenant)  # type: ignore[arg-type]
        if new_tenant != user.tenant_id:
            # Roles of the old tenant do not travel with the user.
            kept = [r for r in (await roles_of(session, [user.id]))[user.id] if r.is_global]
            user.tenant_id = new_tenant  # type: ignore[assignment]
            await _set_roles(session, user, kept)
    if "permissions" in changes or "roles" in changes:
        current_roles = (await roles_of(session, [user.id]))[user.id]
        new_perms = list(user.permissions or [])
        if "permissions" in changes:
            new_perms = perms.validate(changes["permissions"])  # type: ignore[arg-type]
        new_roles = current_roles
        if "roles" in changes:
            new_roles = await assignable(session, changes["roles"], user.tenant_id)  # type: ignore[arg-type]
        # Only what this call adds is a grant; what the user already has is not given again.
        held_ids = {r.id for r in current_roles}
        policy.require_grantable(
            principal,
            set(new_perms) - set(user.permissions or []),
            [r for r in new_roles if r.id not in held_ids],
        )
        user.permissions = new_perms
        if "roles" in changes:
            await _set_roles(session, user, new_roles)
    if "status" in changes:
        user.status = _check_status(changes["status"])
        if user.status == "DISABLED":
            await revoke_user_tokens(session, user.id)
    if "password" in changes:
        if policy.password_change_needs_current(principal, user.id) and not current_password_verified:
            raise InvalidInput("currentPassword is required to change a password.", field="currentPassword")
        user.password_hash = await hash_off_loop(str(changes["password"]))
        keep = principal.token_id if principal.user_id == user.id else None
        await revoke_user_tokens(session, user.id, keep_token_id=keep, keep_api_tokens=keep_api_tokens)
    for name in ("firstname", "lastname", "img", "confirmed"):
        if name in changes:
            setattr(user, name, changes[name])
    user.updated_at = utcnow()
    await session.flush()
    return user


async def delete_user(session: AsyncSession, principal: Principal, user_id: str) -> None:
    user = await get_user(session, principal, user_id)
    policy.require(principal, Action.USER_DELETE)
    if user.id == principal.user_id:
        raise Conflict("You cannot delete your own account.")
    await _require_may_act(session, principal, user)
    await session.delete(user)


async def user_by_username(session: AsyncSession, username: str) -> User:
    user = await session.scalar(sa.select(User).where(User.username == username.strip().lower()))
    if user is None:
        raise NotFound(f"User {username} not found.")
    return user


async def set_user_status(session: AsyncSession, username: str, status: str) -> User:
    """The CLI's way to disable (or re-enable) an account; disabling revokes its tokens."""
    user = await user_by_username(session, username)
    user.status = _check_status(status)
    user.updated_at = utcnow()
    if status == "DISABLED":
        await revoke_user_tokens(session, user.id)
    return user
