"""Log queries. No HTTP here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import ListQuery, bounded_total
from flowyard.clock import isoformat
from flowyard.errors import Forbidden, InvalidInput, Problem
from flowyard.iam.models import User
from flowyard.iam.principal import Principal
from flowyard.iam.visibility import tenant_data_clause
from flowyard.ids import is_valid_id
from flowyard.logs.models import ERRORS, LogEntry

LOG_FILTERS = frozenset({"tenant", "flowId", "stepId", "executionId"})
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
# For the OpenAPI document: what parse_bool and parse_time accept (parse_time checks the
# pattern first, so the document is never narrower than the server).
BOOL_PATTERN = r"^\s*([Tt][Rr][Uu][Ee]|1|[Yy][Ee][Ss]|[Ff][Aa][Ll][Ss][Ee]|0|[Nn][Oo])\s*$"
TIME_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}(:[0-9]{2}(:[0-9]{2}([.,][0-9]{1,9})?)?)?)?"
    r"([Zz]|[+ -][0-9]{2}(:?[0-9]{2})?)?$"
)
_TIME = re.compile(TIME_PATTERN)


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
        if not _TIME.match(raw) or raw.endswith("\n"):
            raise ValueError
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


async def named_scope(session: AsyncSession, principal: Principal, named: str) -> sa.ColumnElement[bool]:
    """The log rows ``filter[tenant]=<named>`` selects for this caller (403 if it may not name it).

    ``named`` is a tenant id, or a user id standing for the flows without a tenant whose user
    owner that user is (a caller without a tenant, such as the first administrator on the
    embedded default, names itself). A non-admin names its own tenant, or itself when it has
    none, and then reads exactly what the counts show it (``tenant_data_clause``); an
    administrator may name any tenant or user.
    """
    if principal.is_admin:
        if await session.scalar(sa.select(User.id).where(User.id == named)) is not None:
            return sa.and_(LogEntry.tenant.is_(None), LogEntry.user_id == named)
        clause: sa.ColumnElement[bool] = LogEntry.tenant == named
        return clause
    if named == (principal.tenant_id or principal.user_id):
        return tenant_data_clause(principal, LogEntry.tenant, LogEntry.user_id)
    if principal.tenant_id:
        raise Forbidden("You can only read your own tenant's logs.")
    raise Forbidden("Without a tenant you can only read the logs of your own flows: name your user id.")


async def query_logs(
    session: AsyncSession,
    principal: Principal,
    lq: ListQuery,
    *,
    errors_only: bool,
    since: datetime | None,
    until: datetime | None,
) -> tuple[Sequence[LogEntry], int, bool]:
    tenant = lq.filters.get("tenant")
    if not tenant:
        raise InvalidInput("filter[tenant] is required.", field="filter[tenant]")
    where = [await named_scope(session, principal, tenant)]
    f = lq.filters
    for key in ("flowId", "executionId"):
        if key in f and not is_valid_id(f[key]):
            raise InvalidInput(f"filter[{key}] must be an id: 24 hex characters.", field=f"filter[{key}]")
    if "flowId" in f:
        where.append(LogEntry.flow_id == f["flowId"])
    if "stepId" in f:
        where.append(LogEntry.step_id == f["stepId"])
    if "executionId" in f:
        where.append(LogEntry.execution_id == f["executionId"])
    if errors_only:
        where.append(sa.and_(ERRORS))  # ix_logs_tenant_errors_id's own predicate
    if since is not None:
        where.append(LogEntry.timestamp >= since)
    if until is not None:
        where.append(LogEntry.timestamp <= until)
    total = await bounded_total(session, [sa.select(LogEntry.id).where(*where)], offset=lq.offset)
    if not total.used or (total.exact and lq.offset >= total.count):
        return [], total.count, total.exact
    # The page's ids from the index (newest first), then only those rows.
    ids = sa.select(LogEntry.id).where(*where).order_by(LogEntry.id.desc()).limit(lq.size).offset(lq.offset)
    rows = await session.scalars(
        sa.select(LogEntry).where(LogEntry.id.in_(ids.subquery().select())).order_by(LogEntry.id.desc())
    )
    return rows.all(), total.count, total.exact
