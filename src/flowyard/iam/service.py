"""The IAM entry points other packages call (CLI, API dependencies, tests, benchmarks).

Nothing is decided here: each name comes from the module of its aggregate —
``tokens`` (bearer tokens, sessions, introspection), ``login`` (password login and
its throttle), ``users``, ``tenants``, ``roles``, ``bootstrap`` (first
administrator) — and every authorization question is answered by ``policy``.
"""

from __future__ import annotations

from flowyard.iam.bootstrap import ensure_first_admin
from flowyard.iam.models import Role, Tenant, Token, User, UserRole
from flowyard.iam.passwords import hash_password, verify_password
from flowyard.iam.permissions import narrow
from flowyard.iam.permissions import validate as check_permissions
from flowyard.iam.roles import (
    create_role,
    delete_role,
    effective_permissions,
    get_role,
    list_roles,
    roles_of,
    update_role,
)
from flowyard.iam.tenants import create_tenant, list_tenants, tenant_by_ref
from flowyard.iam.tokens import (
    Lifetimes,
    authenticate,
    create_api_token,
    delete_token,
    hash_token,
    introspect,
    issue_api_token,
    list_tokens,
    logout,
    open_session,
    revoke_user_tokens,
    slide_session,
)
from flowyard.iam.users import (
    USER_STATUSES,
    create_user,
    delete_user,
    get_user,
    list_users,
    set_user_status,
    update_user,
    user_by_username,
)

__all__ = [
    "USER_STATUSES",
    "Lifetimes",
    "Role",
    "Tenant",
    "Token",
    "User",
    "UserRole",
    "authenticate",
    "check_permissions",
    "create_api_token",
    "create_role",
    "create_tenant",
    "create_user",
    "delete_role",
    "delete_token",
    "delete_user",
    "effective_permissions",
    "ensure_first_admin",
    "get_role",
    "get_user",
    "hash_password",
    "hash_token",
    "introspect",
    "issue_api_token",
    "list_roles",
    "list_tenants",
    "list_tokens",
    "list_users",
    "logout",
    "narrow",
    "open_session",
    "revoke_user_tokens",
    "roles_of",
    "set_user_status",
    "slide_session",
    "tenant_by_ref",
    "update_role",
    "update_user",
    "user_by_username",
    "verify_password",
]
