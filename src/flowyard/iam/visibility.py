"""Visibility rules shared by several domains: which recorded data a caller may read.

Counts (``executions/service.py``) and logs (``logs/service.py``) scope their rows with
``tenant_data_clause``, one rule in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from flowyard.iam.principal import Principal


def tenant_data_clause(principal: Principal, tenant_col: Any, user_col: Any) -> sa.ColumnElement[bool]:
    """Counts and logs: the caller's own tenant's data, or without a tenant the data of the
    flows whose user owner it was; admins see all. ``user_col`` is the flow's user owner
    recorded on the row."""
    if principal.is_admin:
        return sa.true()
    if principal.tenant_id:
        clause: sa.ColumnElement[bool] = tenant_col == principal.tenant_id
        return clause
    return sa.and_(tenant_col.is_(None), user_col == principal.user_id)


def owner_user_of(owners: Sequence[dict[str, str]]) -> str | None:
    """The user a flow's executions, counts and logs are charged to, and whose tenantless
    secrets a tenantless flow may use: the first ``user`` entry of its owners."""
    return next((o["id"] for o in owners if o.get("type") == "user"), None)


def shares_owner(owners: Sequence[dict[str, str]], others: Sequence[dict[str, str]]) -> bool:
    """Whether two flows have an owner (a user or a tenant) in common: an error flow must be
    one the failing flow's owners see (SPEC §11)."""
    mine = {(o.get("type"), o.get("id")) for o in owners}
    return any((o.get("type"), o.get("id")) in mine for o in others)
