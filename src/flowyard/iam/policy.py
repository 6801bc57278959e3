"""Every authorization decision of IAM (SPEC §2), written once.

The services (``users``, ``tokens``, ``tenants``, ``roles``, ``login``) ask the
questions below and nothing else decides; routers only translate HTTP.

- Which permission an action needs: the table ``REQUIRED``.
- "May this principal grant these permissions / roles": ``require_grantable``.
  A grant (direct permissions or roles, on create or update, to others or to
  oneself) gives at most what the caller holds: ``all`` covers everything,
  ``tenant.all`` covers ``tenant.*`` only. Only what a call *adds* is a grant.
- "May it act on this user": ``may_act_on_user`` (admin: anyone; a tenant
  member: non-admin users of its own tenant; a tenantless non-admin: only itself).
- "Which users may it see": ``sees_every_user`` / ``user_visible``.
- "May it name this user as a flow's owner": ``may_name_owner``.
- "May it manage the roles of tenant X": ``require_role_scope``.
- "Does changing this password need the current one": ``password_change_needs_current``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from flowyard.errors import Forbidden
from flowyard.iam import permissions as perms
from flowyard.iam.principal import Principal


class Action(StrEnum):
    USER_CREATE = "user.create"
    USER_UPDATE = "user.update"  # anything but one's own name, image and password
    USER_DELETE = "user.delete"
    USER_READ_ALL = "user.readAll"  # see users outside one's tenant
    TENANT_CREATE = "tenant.create"
    TENANT_READ_ALL = "tenant.readAll"  # see every tenant, not only one's own
    TOKEN_CREATE = "token.create"
    TOKEN_DELETE = "token.delete"
    TOKEN_INTROSPECT = "token.introspect"
    ROLE_READ = "role.read"
    ROLE_CREATE = "role.create"
    ROLE_UPDATE = "role.update"
    ROLE_DELETE = "role.delete"
    GLOBAL_ROLE_WRITE = "role.global.write"  # create, change or delete a role of no tenant
    USER_MOVE_TENANT = "user.moveTenant"
    TOKEN_FOR_OTHERS = "token.forOthers"
    PASSWORD_RESET = "user.passwordReset"  # set another user's password without the current one


REQUIRED: dict[Action, str] = {
    Action.USER_CREATE: perms.ACCOUNT_CREATE,
    Action.USER_UPDATE: perms.ACCOUNT_UPDATE,
    Action.USER_DELETE: perms.ACCOUNT_DELETE,
    Action.USER_READ_ALL: perms.ACCOUNT_READ,
    Action.TENANT_CREATE: perms.TENANT_CREATE,
    Action.TENANT_READ_ALL: perms.TENANT_READ,
    Action.TOKEN_CREATE: perms.TOKEN_CREATE,
    Action.TOKEN_DELETE: perms.TOKEN_DELETE,
    Action.TOKEN_INTROSPECT: perms.TOKEN_INTROSPECT,
    Action.ROLE_READ: perms.ROLES_READ,
    Action.ROLE_CREATE: perms.ROLES_CREATE,
    Action.ROLE_UPDATE: perms.ROLES_UPDATE,
    Action.ROLE_DELETE: perms.ROLES_DELETE,
    Action.GLOBAL_ROLE_WRITE: perms.ALL,
    Action.USER_MOVE_TENANT: perms.ALL,
    Action.TOKEN_FOR_OTHERS: perms.ALL,
    Action.PASSWORD_RESET: perms.ALL,
}

# A user may change these fields of its own account without iam.account.update.
SELF_EDITABLE_USER_FIELDS = frozenset({"firstname", "lastname", "password", "img"})


def allowed(principal: Principal, action: Action) -> bool:
    return principal.can(REQUIRED[action])


def require(principal: Principal, action: Action) -> None:
    principal.require(REQUIRED[action])


# -- grants -------------------------------------------------------------------------


def ungrantable(principal: Principal, granted: Iterable[str]) -> list[str]:
    """The permissions in ``granted`` the principal could not give (sorted, unique)."""
    return sorted({p for p in granted if not principal.can(p)})


def require_grantable(principal: Principal, permissions: Iterable[str], roles: Iterable[object] = ()) -> None:
    """Refuse a grant of ``permissions`` directly and of ``roles`` (objects with
    ``name`` and ``permissions``) that gives more than the caller's effective permissions."""
    excess = ungrantable(principal, permissions)
    if excess:
        raise Forbidden(f"You cannot grant permissions you lack: {', '.join(excess)}.")
    for role in roles:
        excess = ungrantable(principal, getattr(role, "permissions", None) or [])
        if excess:
            name = getattr(role, "name", "?")
            raise Forbidden(
                f"You cannot grant role {name}: it carries permissions you lack: {', '.join(excess)}."
            )


# -- users ----------------------------------------------------------------------------


def sees_every_user(principal: Principal) -> bool:
    return allowed(principal, Action.USER_READ_ALL)


def user_visible(principal: Principal, user_id: str, user_tenant: str | None) -> bool:
    if sees_every_user(principal) or user_id == principal.user_id:
        return True
    return principal.tenant_id is not None and user_tenant == principal.tenant_id


def may_name_owner(principal: Principal, user_id: str, user_tenant: str | None) -> bool:
    """Whether the caller may name this (local) user as an owner of a flow: the owner sees and
    edits the flow, and its executions, counts and logs are charged to the first user owner.
    An administrator names anyone; anyone else itself, and a tenant member the users of its
    own tenant (``iam.account.read``, which shows every user, does not widen this)."""
    if principal.is_admin or user_id == principal.user_id:
        return True
    return principal.tenant_id is not None and user_tenant == principal.tenant_id


def may_act_on_user(principal: Principal, user_id: str, user_tenant: str | None, user_is_admin: bool) -> bool:
    """Whether the caller may change or delete this user (given the action's permission).

    An administrator may act on anyone; a tenant member on the non-admin users of its own
    tenant; a tenantless non-admin on nobody but itself (``None == None`` is not a shared
    tenant). Nobody but an administrator acts on an administrator.
    """
    if principal.is_admin or user_id == principal.user_id:
        return True
    if user_is_admin:
        return False
    return principal.tenant_id is not None and user_tenant == principal.tenant_id


def user_update_action(principal: Principal, user_id: str, fields: Iterable[str]) -> Action | None:
    """The action a user update needs, or None for one's own name, image and password."""
    if user_id == principal.user_id and set(fields) <= SELF_EDITABLE_USER_FIELDS:
        return None
    return Action.USER_UPDATE


def password_change_needs_current(principal: Principal, user_id: str) -> bool:
    """Setting a password needs the current one, except an administrator resetting another's."""
    return user_id == principal.user_id or not allowed(principal, Action.PASSWORD_RESET)


# -- tenants and roles --------------------------------------------------------------------


def require_role_scope(principal: Principal, scope: str | None) -> None:
    """May the caller write roles of tenant ``scope`` (``None``: global roles)?"""
    if scope is None:
        if not allowed(principal, Action.GLOBAL_ROLE_WRITE):
            raise Forbidden("Only an administrator can create or change global roles.")
        return
    if not principal.is_admin and scope != principal.tenant_id:
        raise Forbidden("You can only manage the roles of your own tenant.")


def role_visible(principal: Principal, is_global: bool, scope: str | None) -> bool:
    return (
        principal.is_admin or is_global or (principal.tenant_id is not None and scope == principal.tenant_id)
    )


def require_own_tenant_for_create(principal: Principal, tenant_id: str | None) -> None:
    """A non-admin creates users only in its own tenant (a tenantless one: nobody)."""
    if principal.is_admin:
        return
    if principal.tenant_id is None or tenant_id != principal.tenant_id:
        raise Forbidden("You can only create users in your own tenant.")
