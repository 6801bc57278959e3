"""Roles: named permission sets, global or of one tenant; a user's effective permissions. No HTTP."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import id_page
from flowyard.clock import utcnow
from flowyard.errors import Conflict, InvalidInput, NotFound
from flowyard.iam import permissions as perms
from flowyard.iam import policy
from flowyard.iam.models import Role, Tenant, User, UserRole
from flowyard.iam.policy import Action
from flowyard.iam.principal import Principal
from flowyard.ids import check_id, is_valid_id


async def effective_permissions(session: AsyncSession, user: User) -> frozenset[str]:
    """The user's own permissions and those of its roles (SPEC §2)."""
    rows = await session.scalars(
        sa.select(Role.permissions)
        .join(UserRole, UserRole.role_id == Role.id)
        .where(UserRole.user_id == user.id)
    )
    return combine_permissions(user.permissions, rows)


def combine_permissions(
    own: Iterable[str] | None, of_roles: Iterable[Iterable[str] | None]
) -> frozenset[str]:
    """The one rule of SPEC §2: a user's own permissions plus those of each role it holds."""
    granted = set(own or [])
    for role_perms in of_roles:
        granted.update(role_perms or [])
    return frozenset(granted)


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


async def assignable(session: AsyncSession, role_ids: Sequence[str], tenant_id: str | None) -> list[Role]:
    """The roles a user of ``tenant_id`` may hold: global ones and its tenant's (400 otherwise)."""
    roles: list[Role] = []
    for i, role_id in enumerate(role_ids):
        role = await session.get(Role, role_id) if is_valid_id(role_id) else None
        if role is None or (not role.is_global and role.scope != tenant_id):
            raise InvalidInput(f"Role {role_id} does not exist in the user's tenant.", field=f"roles[{i}]")
        if role not in roles:
            roles.append(role)
    return roles


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidInput("name must be 1 to 200 characters.", field="name")
    return name


async def create_role(
    session: AsyncSession,
    *,
    name: str,
    permissions: Sequence[str],
    description: str | None = None,
    scope: str | None = None,
    principal: Principal | None = None,
) -> Role:
    """A role in a tenant (``scope``), or a global one. ``principal`` is None for the CLI.

    A non-admin's role goes to its own tenant when ``scope`` is omitted.
    """
    perm_list = perms.validate(permissions)
    if principal is not None:
        policy.require(principal, Action.ROLE_CREATE)
        if scope is None and not principal.is_admin:
            scope = principal.tenant_id
        policy.require_role_scope(principal, scope)
        policy.require_grantable(principal, perm_list)
    name = _check_name(name)
    if scope is not None and (not is_valid_id(scope) or await session.get(Tenant, scope) is None):
        raise InvalidInput(f"Tenant {scope} does not exist.", field="scope")
    await _require_unique_name(session, name, scope)
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


async def _require_unique_name(
    session: AsyncSession, name: str, scope: str | None, *, other_than: str | None = None
) -> None:
    """Role names are unique per tenant (and among global roles): 409 before the constraint would."""
    q = sa.select(Role.id).where(
        Role.name == name, Role.scope.is_(None) if scope is None else Role.scope == scope
    )
    if other_than is not None:
        q = q.where(Role.id != other_than)
    if await session.scalar(q):
        raise Conflict(f"A role named {name} already exists there.")


def _visible_clause(principal: Principal) -> sa.ColumnElement[bool]:
    if principal.is_admin:
        return sa.true()
    if principal.tenant_id is None:
        return Role.is_global.is_(True)
    return sa.or_(Role.is_global.is_(True), Role.scope == principal.tenant_id)


async def list_roles(
    session: AsyncSession, principal: Principal, *, limit: int, offset: int
) -> tuple[Sequence[Role], int]:
    policy.require(principal, Action.ROLE_READ)
    where = _visible_clause(principal)
    return await id_page(session, Role, where, limit=limit, offset=offset)


async def get_role(session: AsyncSession, principal: Principal, role_id: str) -> Role:
    policy.require(principal, Action.ROLE_READ)
    check_id(role_id, "role")
    role = await session.get(Role, role_id)
    if role is None or not policy.role_visible(principal, role.is_global, role.scope):
        raise NotFound(f"Role {role_id} not found.")
    return role


async def update_role(
    session: AsyncSession, principal: Principal, role_id: str, changes: dict[str, object]
) -> Role:
    role = await get_role(session, principal, role_id)
    policy.require(principal, Action.ROLE_UPDATE)
    policy.require_role_scope(principal, role.scope)
    if "permissions" in changes:
        new_perms = perms.validate(changes["permissions"] or [])  # type: ignore[arg-type]
        # Adding a permission to a role grants it to every holder of the role.
        policy.require_grantable(principal, set(new_perms) - set(role.permissions or []))
        role.permissions = new_perms
    if "name" in changes:
        name = _check_name(str(changes["name"] or ""))
        await _require_unique_name(session, name, role.scope, other_than=role.id)
        role.name = name
    if "description" in changes:
        role.description = changes["description"]  # type: ignore[assignment]
    role.updated_at = utcnow()
    await session.flush()
    return role


async def delete_role(session: AsyncSession, principal: Principal, role_id: str) -> None:
    role = await get_role(session, principal, role_id)
    policy.require(principal, Action.ROLE_DELETE)
    policy.require_role_scope(principal, role.scope)
    await session.delete(role)
