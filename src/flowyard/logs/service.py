"""Log queries. No HTTP here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import ListQuery
from flowyard.clock import isoformat
from flowyard.errors import Forbidden, InvalidInput, Problem
from flowyard.iam.principal import Principal
from flowyard.logs.models import LogEntry

LOG_FILTERS = frozenset({"tenant", "flowId", "stepId", "executionId"})
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def parse_bool(raw: str | None, name: str, problems: list[Problem]) -> bool:
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        problems.append(Problem(f"{name} must be true/1/yes or false/0/no.", name))
    return False


def parse_time(raw: str | None, name: str, problems: list[Problem]) -> datetime | None:
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        problems.append(Problem(f"{name} must be an ISO 8601 timestamp.", name))
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)  # naive means UTC, like every time here


def to_dict(e: LogEntry) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "timestamp": isoformat(e.timestamp),
        "level": e.level,
        "message": e.message,
        "tenant": e.tenant,
        "flowId": e.flow_id,
        "executionId": e.execution_id,
        "stepId": e.step_id,
        "componentId": e.component_id,
        "data": e.data,
    }


async def query_logs(
    session: AsyncSession,
    principal: Principal,
    lq: ListQuery,
    *,
    errors_only: bool,
    since: datetime | None,
    until: datetime | None,
) -> tuple[Sequence[LogEntry], int]:
    tenant = lq.filters.get("tenant")
    if not tenant:
        raise InvalidInput("filter[tenant] is required.", field="filter[tenant]")
    where: list[sa.ColumnElement[bool]] = []
    if principal.is_admin or (principal.tenant_id and tenant == principal.tenant_id):
        where.append(LogEntry.tenant == tenant)
    elif not principal.tenant_id and tenant == principal.user_id:
        # A caller without a tenant names itself and reads its own flows' logs.
        where += [LogEntry.tenant.is_(None), LogEntry.user_id == principal.user_id]
    else:
        raise Forbidden("You can only read your own tenant's logs.")
    f = lq.filters
    if "flowId" in f:
        where.append(LogEntry.flow_id == f["flowId"])
    if "stepId" in f:
        where.append(LogEntry.step_id == f["stepId"])
    if "executionId" in f:
        where.append(LogEntry.execution_id == f["executionId"])
    if errors_only:
        where.append(LogEntry.level == "error")
    if since is not None:
        where.append(LogEntry.timestamp >= since)
    if until is not None:
        where.append(LogEntry.timestamp <= until)
    total = await session.scalar(sa.select(sa.func.count()).select_from(LogEntry).where(*where)) or 0
    rows = (
        await session.scalars(
            sa.select(LogEntry).where(*where).order_by(LogEntry.id.desc()).limit(lq.size).offset(lq.offset)
        )
    ).all()
    return rows, total
