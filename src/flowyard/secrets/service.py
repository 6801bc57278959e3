"""Secrets: create, list, delete, and resolve for the engine. No HTTP here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import id_page
from flowyard.clock import isoformat, utcnow
from flowyard.errors import Forbidden, InvalidInput, NotFound
from flowyard.iam.principal import Principal
from flowyard.ids import check_id, is_valid_id
from flowyard.secrets.crypto import SecretBox
from flowyard.secrets.models import Secret

SECRET_CREATE = "iam.secret.create"
SECRET_READ = "iam.secret.read"
MAX_VALUE_BYTES = 64 * 1024


def _visible(principal: Principal) -> sa.ColumnElement[bool]:
    if principal.is_admin:
        return sa.true()
    if principal.tenant_id:
        return Secret.tenant == principal.tenant_id
    return sa.and_(Secret.tenant.is_(None), Secret.owner_user == principal.user_id)


def to_dict(s: Secret) -> dict[str, Any]:
    return {
        "id": s.id,
        "name": s.name,
        "tenant": s.tenant,
        "owner": s.owner_user,
        "createdAt": isoformat(s.created_at),
        "updatedAt": isoformat(s.updated_at),
    }


async def create(
    session: AsyncSession,
    principal: Principal,
    box: SecretBox,
    *,
    name: str,
    value: dict[str, Any],
    tenant: str | None,
) -> Secret:
    principal.require(SECRET_CREATE)
    if tenant is not None and tenant != principal.tenant_id and not principal.is_admin:
        raise Forbidden("You can only store secrets for your own tenant.")
    sealed = box.seal(value)
    if len(sealed) > MAX_VALUE_BYTES * 2:
        raise InvalidInput(f"value must be at most {MAX_VALUE_BYTES} bytes of JSON.", field="value")
    now = utcnow()
    secret = Secret(
        name=name,
        tenant=tenant if tenant is not None else principal.tenant_id,
        owner_user=principal.user_id,
        value=sealed,
        created_at=now,
        updated_at=now,
    )
    session.add(secret)
    await session.flush()
    return secret


async def list_secrets(
    session: AsyncSession, principal: Principal, *, limit: int, offset: int
) -> tuple[Sequence[Secret], int]:
    principal.require(SECRET_READ)
    where = _visible(principal)
    return await id_page(session, Secret, where, limit=limit, offset=offset)


async def rotate(
    session: AsyncSession, principal: Principal, box: SecretBox, secret_id: str, *, value: dict[str, Any]
) -> Secret:
    """Replace a secret's value, keeping its id: the nodes naming it use the new value once
    their engine re-reads the flow (within a minute, ``runtime/worker.py`` ``_CREDENTIALS_TTL``)."""
    principal.require(SECRET_CREATE)
    check_id(secret_id, "secret")
    secret = await session.scalar(sa.select(Secret).where(Secret.id == secret_id, _visible(principal)))
    if secret is None:
        raise NotFound(f"Secret {secret_id} not found.")
    sealed = box.seal(value)
    if len(sealed) > MAX_VALUE_BYTES * 2:
        raise InvalidInput(f"value must be at most {MAX_VALUE_BYTES} bytes of JSON.", field="value")
    secret.value = sealed
    secret.updated_at = utcnow()
    await session.flush()
    return secret


async def delete(session: AsyncSession, principal: Principal, secret_id: str) -> None:
    principal.require(SECRET_CREATE)
    check_id(secret_id, "secret")
    secret = await session.scalar(sa.select(Secret).where(Secret.id == secret_id, _visible(principal)))
    if secret is None:
        raise NotFound(f"Secret {secret_id} not found.")
    await session.delete(secret)


UNUSABLE = "not found, or not usable by this flow's owners"
"""The one answer for a secret a flow may not use: an unknown id and another tenant's secret
read the same, so a flow author cannot probe which secrets exist."""


def usable_clause(tenant: str | None, owner_user: str | None) -> sa.ColumnElement[bool]:
    """The one rule for "a secret these owners may use": a flow with a tenant uses its
    tenant's secrets; a flow without one uses the tenantless secrets of its user owner (the
    first ``user`` entry of its owners, ``iam.visibility.owner_user_of``). Saving a flow
    (flows and templates services), starting it and running it all ask this."""
    if tenant:
        return Secret.tenant == tenant
    if owner_user is None:
        return sa.false()
    return sa.and_(Secret.tenant.is_(None), Secret.owner_user == owner_user)


async def unusable(
    session: AsyncSession, ids: Iterable[str], *, tenant: str | None, owner_user: str | None
) -> dict[str, str]:
    """Of ``ids``, those a flow of ``tenant`` / ``owner_user`` may not use, each with the
    reason (``UNUSABLE``); nothing is decrypted."""
    wanted = sorted(set(ids))
    valid = [i for i in wanted if is_valid_id(i)]
    found: set[str] = set()
    if valid:
        query = sa.select(Secret.id).where(Secret.id.in_(valid), usable_clause(tenant, owner_user))
        found = set((await session.scalars(query)).all())
    return {i: UNUSABLE for i in wanted if i not in found}


async def resolve(
    session: AsyncSession, box: SecretBox, ids: Iterable[str], *, tenant: str | None, owner_user: str | None
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Decrypt the secrets a flow's nodes name. A flow may use its own tenant's
    secrets (or, without a tenant, its owner's), ``usable_clause``; anything else counts
    as missing."""
    wanted = sorted({i for i in ids if is_valid_id(i)})
    found: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {i: "not found" for i in ids}
    if not wanted:
        return found, problems
    scope = usable_clause(tenant, owner_user)
    for secret in (await session.scalars(sa.select(Secret).where(Secret.id.in_(wanted), scope))).all():
        try:
            found[secret.id] = box.open(secret.value)
            problems.pop(secret.id, None)
        except ValueError as exc:
            problems[secret.id] = str(exc)
    return found, problems


# -- names, for portable flows (flows/portable.py): a document names a secret, never its id ------


async def names_of(session: AsyncSession, ids: Iterable[str]) -> dict[str, str]:
    """The names of the secrets ``ids`` (unknown ids are left out); nothing is decrypted."""
    valid = sorted({i for i in ids if is_valid_id(i)})
    if not valid:
        return {}
    rows = await session.execute(sa.select(Secret.id, Secret.name).where(Secret.id.in_(valid)))
    return {sid: name for sid, name in rows}


async def usable_by_name(
    session: AsyncSession, names: Iterable[str], *, tenant: str | None, owner_user: str | None
) -> dict[str, list[str]]:
    """For each of ``names``, the ids of the secrets of that name a flow of ``tenant`` /
    ``owner_user`` may use (``usable_clause``): none, one, or several (ambiguous)."""
    wanted = sorted(set(names))
    found: dict[str, list[str]] = {n: [] for n in wanted}
    if wanted:
        query = (
            sa.select(Secret.name, Secret.id)
            .where(Secret.name.in_(wanted), usable_clause(tenant, owner_user))
            .order_by(Secret.id)
        )
        for name, sid in await session.execute(query):
            found[name].append(sid)
    return found
