"""Tenants. No HTTP here."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import id_page
from flowyard.clock import utcnow
from flowyard.errors import Conflict, InvalidInput, NotFound
from flowyard.iam import policy
from flowyard.iam.models import Tenant
from flowyard.iam.policy import Action
from flowyard.iam.principal import Principal
from flowyard.ids import is_valid_id


async def create_tenant(session: AsyncSession, name: str, principal: Principal | None = None) -> Tenant:
    """``principal`` is None for the CLI and tests' set-up."""
    if principal is not None:
        policy.require(principal, Action.TENANT_CREATE)
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


async def require_exists(session: AsyncSession, tenant_id: str | None, field: str = "tenant") -> None:
    if tenant_id is not None and (not is_valid_id(tenant_id) or await session.get(Tenant, tenant_id) is None):
        raise InvalidInput(f"Tenant {tenant_id} does not exist.", field=field)


async def list_tenants(
    session: AsyncSession, principal: Principal, *, limit: int, offset: int
) -> tuple[Sequence[Tenant], int]:
    """Every tenant with iam.tenant.read; otherwise the caller's own (none without a tenant)."""
    if policy.allowed(principal, Action.TENANT_READ_ALL):
        where: sa.ColumnElement[bool] = sa.true()
    elif principal.tenant_id is not None:
        where = Tenant.id == principal.tenant_id
    else:
        where = sa.false()
    return await id_page(session, Tenant, where, limit=limit, offset=offset)
