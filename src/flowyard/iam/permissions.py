"""The permission vocabulary: the seed's exact enumeration plus ``flowTemplates.read``."""

from __future__ import annotations

from collections.abc import Iterable

from flowyard.errors import InvalidInput, Problem

ALL = "all"
TENANT_ALL = "tenant.all"

FLOWS_READ = "tenant.flows.read"
FLOWS_CREATE = "tenant.flows.create"
FLOWS_UPDATE = "tenant.flows.update"
FLOWS_DELETE = "tenant.flows.delete"
TEMPLATES_READ = "flowTemplates.read"

ACCOUNT_CREATE = "iam.account.create"
ACCOUNT_READ = "iam.account.read"
ACCOUNT_UPDATE = "iam.account.update"
ACCOUNT_DELETE = "iam.account.delete"
TENANT_CREATE = "iam.tenant.create"
TENANT_READ = "iam.tenant.read"
TENANT_UPDATE = "iam.tenant.update"
TENANT_DELETE = "iam.tenant.delete"
TOKEN_CREATE = "iam.token.create"
TOKEN_DELETE = "iam.token.delete"
TOKEN_INTROSPECT = "iam.token.introspect"
ROLES_READ = "tenant.roles.read"
ROLES_CREATE = "tenant.roles.create"
ROLES_UPDATE = "tenant.roles.update"
ROLES_DELETE = "tenant.roles.delete"

PERMISSIONS: tuple[str, ...] = (
    "all",
    "iam.tenant.create",
    "iam.tenant.read",
    "iam.tenant.update",
    "iam.tenant.delete",
    "iam.secret.create",
    "iam.secret.read",
    "iam.key.create",
    "iam.key.read",
    "iam.key.delete",
    "iam.account.create",
    "iam.account.read",
    "iam.account.update",
    "iam.account.delete",
    "iam.token.create",
    "iam.token.update",
    "iam.token.delete",
    "iam.token.introspect",
    "tenant.all",
    "tenant.membership.create",
    "tenant.membership.update",
    "tenant.membership.delete",
    "tenant.profile.read",
    "tenant.profile.update",
    "tenant.profile.delete",
    "tenant.roles.read",
    "tenant.roles.create",
    "tenant.roles.update",
    "tenant.roles.delete",
    "tenant.flows.read",
    "tenant.flows.create",
    "tenant.flows.update",
    "tenant.flows.delete",
    "flowTemplates.read",
)
KNOWN = frozenset(PERMISSIONS)

# What a new tenant member gets by default (CLI ``users create --tenant`` without
# explicit permissions): work with the tenant's flows and templates.
MEMBER_DEFAULT: tuple[str, ...] = (
    FLOWS_READ,
    FLOWS_CREATE,
    FLOWS_UPDATE,
    FLOWS_DELETE,
    TEMPLATES_READ,
    TOKEN_CREATE,
    TOKEN_DELETE,
)


def implied(granted: frozenset[str], wanted: str) -> bool:
    """Whether ``granted`` covers ``wanted``. Tenant scoping is the caller's job."""
    if ALL in granted or wanted in granted:
        return True
    return wanted.startswith("tenant.") and TENANT_ALL in granted


def validate(values: Iterable[str], field: str = "permissions") -> list[str]:
    """The values, de-duplicated in order; 400 naming every unknown one."""
    out: list[str] = []
    problems = []
    for i, value in enumerate(values):
        if value not in KNOWN:
            problems.append(Problem(f"Unknown permission {value!r}.", f"{field}[{i}]"))
        elif value not in out:
            out.append(value)
    if problems:
        raise InvalidInput(problems)
    return out


def narrow(granted: frozenset[str], token_permissions: Iterable[str] | None) -> frozenset[str]:
    """What a token may do: its listed permissions that its user holds.

    Matched by implication, not by set intersection, so a token narrowed to
    ``tenant.flows.read`` works for a user who holds it through ``all`` or
    ``tenant.all``.
    """
    if token_permissions is None:
        return granted
    return frozenset(p for p in token_permissions if implied(granted, p))
