"""Flow templates: list, read, admin writes, CLI import, and flows made from
templates. No HTTP here.

Visibility follows SPEC §4, decided here only (``visible_clause`` for lists,
``is_visible`` for one template, the same rule): a template is visible when its
owners include the caller or the caller's tenant, or when it is ``shared`` (a
catalog template); administrators (``all``) see everything. A template with no
owners that is not shared is seen by administrators only.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard import ids
from flowyard.api.listing import ListQuery, order_by, search_clause
from flowyard.clock import isoformat, utcnow
from flowyard.components.registry import Registry
from flowyard.db.dialect import dialect_name
from flowyard.errors import Forbidden, InvalidInput, NotFound, Problem
from flowyard.flows import service as flows
from flowyard.flows.models import Flow
from flowyard.flows.validation import validate_flow_body
from flowyard.iam import permissions as perms
from flowyard.iam.models import User
from flowyard.iam.principal import Principal
from flowyard.ids import is_valid_id, new_id
from flowyard.templates.models import SEARCH_TABLE, Template, TemplateOwner, TemplateTag

TEMPLATE_FILTERS = frozenset({"status", "user"})
TEMPLATE_SORTS = frozenset({"createdAt", "updatedAt", "name"})
_STATUS_FILTER = {"published": "published", "draft": "draft", "1": "published", "0": "draft"}
# What the list accepts, for the OpenAPI document (templates.router).
STATUS_FILTER_VALUES = sorted(_STATUS_FILTER)
SORT_VALUES = sorted(TEMPLATE_SORTS | {f"-{s}" for s in TEMPLATE_SORTS})
MAX_FILTER_TAGS = 100
MAX_IMPORT = 10_000
_FROM_TEMPLATE_KEYS = frozenset({"name", "description", "cron", "fields"})


def check_id(template_id: str) -> None:
    ids.check_id(template_id, "template")


def not_found(template_id: str) -> NotFound:
    return NotFound(f"Template {template_id} not found.")


def visible_clause(principal: Principal) -> sa.ColumnElement[bool]:
    if principal.is_admin:
        return sa.true()
    mine = sa.or_(
        *(
            sa.and_(TemplateOwner.owner_type == t, TemplateOwner.owner_id == i)
            for t, i in principal.owner_keys()
        )
    )
    return sa.or_(
        Template.shared.is_(True), Template.id.in_(sa.select(TemplateOwner.template_id).where(mine))
    )


def is_visible(principal: Principal, template: Template) -> bool:
    return principal.is_admin or template.shared or principal.owns(template.owners)


def to_dict(template: Template) -> dict[str, Any]:
    return {
        "id": template.id,
        "name": template.name,
        "description": template.description,
        "graph": template.graph,
        "type": template.type,
        "cron": template.cron,
        "owners": template.owners,
        "status": template.status,
        "tags": template.tags,
        "shared": template.shared,
        "createdAt": isoformat(template.created_at),
        "updatedAt": isoformat(template.updated_at),
    }


async def get_template(session: AsyncSession, principal: Principal, template_id: str) -> Template:
    principal.require(perms.TEMPLATES_READ)
    check_id(template_id)
    template = await session.get(Template, template_id)
    if template is None or not is_visible(principal, template):
        raise not_found(template_id)
    return template


def parse_tags(values: Sequence[str]) -> list[str] | None:
    """``tags=a,b`` (repeatable) as a list; None when the parameter is absent."""
    if not values:
        return None
    tags = list(dict.fromkeys(t.strip() for v in values for t in v.split(",") if t.strip()))
    if not tags:
        raise InvalidInput("tags must name at least one tag (comma-separated).", field="tags")
    if len(tags) > MAX_FILTER_TAGS or any(len(t) > 100 for t in tags):
        raise InvalidInput(
            f"tags may name at most {MAX_FILTER_TAGS} tags of at most 100 characters.", field="tags"
        )
    return tags


async def _check_user_filter(session: AsyncSession, principal: Principal, user_id: str) -> None:
    # The seed limits filter[user] to admins and members of the same tenant; an
    # unknown user answers like a foreign one, so ids cannot be probed.
    if principal.is_admin or user_id == principal.user_id:
        return
    tenant = (
        await session.scalar(sa.select(User.tenant_id).where(User.id == user_id))
        if is_valid_id(user_id)
        else None
    )
    if principal.tenant_id is None or tenant != principal.tenant_id:
        raise Forbidden("filter[user] is limited to administrators and users of the same tenant.")


async def list_templates(
    session: AsyncSession, principal: Principal, lq: ListQuery, tags: list[str] | None = None
) -> tuple[Sequence[Template], int]:
    principal.require(perms.TEMPLATES_READ)
    where: list[sa.ColumnElement[bool]] = [visible_clause(principal)]
    problems = []
    f = lq.filters
    if "status" in f:
        if f["status"] not in _STATUS_FILTER:
            problems.append(Problem("filter[status] must be published, draft, 1 or 0.", "filter[status]"))
        else:
            where.append(Template.status == _STATUS_FILTER[f["status"]])
    user = f.get("user")
    if user is not None and (not user or len(user) > 64):
        problems.append(Problem("filter[user] must be a user id.", "filter[user]"))
    if problems:
        raise InvalidInput(problems)
    if user is not None:
        await _check_user_filter(session, principal, user)
        where.append(
            Template.id.in_(
                sa.select(TemplateOwner.template_id).where(
                    TemplateOwner.owner_type == "user", TemplateOwner.owner_id == user
                )
            )
        )
    if tags is not None:
        tagged = sa.select(TemplateTag.template_id).where(TemplateTag.tag.in_(tags))
        untagged = ~sa.exists().where(TemplateTag.template_id == Template.id)
        where.append(sa.or_(Template.id.in_(tagged), untagged))
    if lq.search:
        # First: on SQLite the first `id IN (...)` drives the lookup, and a search is
        # usually narrower than visibility (no match: 0.1 ms instead of 15 ms for a member).
        where.insert(
            0,
            search_clause(
                dialect_name(session),
                lq.search,
                id_col=Template.id,
                name_lc=Template.name_lc,
                description_lc=Template.description_lc,
                fts_table=SEARCH_TABLE,
            ),
        )
    total = await session.scalar(sa.select(sa.func.count()).select_from(Template).where(*where)) or 0
    if total == 0 or lq.offset >= total:
        return [], total
    sort_cols: dict[str, sa.ColumnElement[Any]] = {
        "createdAt": Template.__table__.c.created_at,
        "updatedAt": Template.__table__.c.updated_at,
        "name": Template.__table__.c.name,
    }
    query = (
        sa.select(Template)
        .where(*where)
        .order_by(*order_by(lq.sort, sort_cols, Template.__table__.c.id))
        .limit(lq.size)
        .offset(lq.offset)
    )
    return (await session.scalars(query)).all(), total


# -- writes (administrators, and the CLI) ------------------------------------------


def _validate(body: Any, registry: Registry, prefix: str = "") -> tuple[dict[str, Any], list[Problem]]:
    clean, problems = validate_flow_body(body, registry=registry, template=True)
    if prefix:
        problems = [
            Problem(
                f"{prefix}.{p.message}" if p.field else f"{prefix}: {p.message}",
                f"{prefix}.{p.field}" if p.field else prefix,
            )
            for p in problems
        ]
    return clean, problems


def _apply(template: Template, clean: dict[str, Any]) -> None:
    template.name = clean["name"]
    template.name_lc = clean["name"].lower()
    template.description = clean["description"]
    template.description_lc = clean["description"].lower() if clean["description"] else None
    template.type = clean["type"]
    template.cron = clean["cron"]
    template.graph = clean["graph"]
    template.owners = clean["owners"]
    template.status = clean["status"]
    template.tags = clean["tags"]
    template.shared = clean["shared"]


def _new(clean: dict[str, Any], created_by: str | None, template_id: str | None = None) -> Template:
    now = utcnow()
    template = Template(id=template_id or new_id(), created_at=now, updated_at=now, created_by=created_by)
    _apply(template, clean)
    return template


async def _write_side_tables(session: AsyncSession, template: Template, *, replace: bool) -> None:
    if replace:
        await session.execute(sa.delete(TemplateOwner).where(TemplateOwner.template_id == template.id))
        await session.execute(sa.delete(TemplateTag).where(TemplateTag.template_id == template.id))
    if template.owners:
        await session.execute(
            sa.insert(TemplateOwner),
            [
                {"template_id": template.id, "owner_type": o["type"], "owner_id": o["id"]}
                for o in template.owners
            ],
        )
    if template.tags:
        await session.execute(
            sa.insert(TemplateTag), [{"template_id": template.id, "tag": t} for t in template.tags]
        )


async def create_template(
    session: AsyncSession, principal: Principal, body: Any, registry: Registry
) -> Template:
    principal.require(perms.ALL)
    clean, problems = _validate(body, registry)
    if problems:
        raise InvalidInput(problems)
    if isinstance(body, dict) and body.get("owners") is None:
        # SPEC §4: without owners the creator owns it (OIH does the same); `[]` means none.
        clean["owners"] = [{"id": principal.user_id, "type": "user"}]
    template = _new(clean, principal.user_id)
    session.add(template)
    await session.flush()
    await _write_side_tables(session, template, replace=False)
    return template


# The fields a PATCH body may give (each the same-named attribute of the template).
_MUTABLE = ("name", "description", "graph", "type", "cron", "owners", "status", "tags", "shared")


def _current(template: Template) -> dict[str, Any]:
    return {name: getattr(template, name) for name in _MUTABLE}


async def update_template(
    session: AsyncSession, principal: Principal, template_id: str, patch: Any, registry: Registry
) -> Template:
    principal.require(perms.ALL)
    check_id(template_id)
    template = await session.get(Template, template_id, with_for_update=True)
    if template is None:
        raise not_found(template_id)
    if not isinstance(patch, dict):
        raise InvalidInput("The body must be a JSON object.")
    merged = {**_current(template), **patch}
    # null clears an optional field; the required ones stay so validation names them.
    merged = {k: v for k, v in merged.items() if v is not None or k in ("name", "graph", "type")}
    clean, problems = _validate(merged, registry)
    if problems:
        raise InvalidInput(problems)
    _apply(template, clean)
    template.updated_at = utcnow()
    await session.flush()
    await _write_side_tables(session, template, replace=True)
    return template


async def delete_template(session: AsyncSession, principal: Principal, template_id: str) -> None:
    principal.require(perms.ALL)
    check_id(template_id)
    result = await session.execute(
        sa.delete(Template).where(Template.id == template_id).execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise not_found(template_id)
    # SQLite only cascades with foreign_keys=ON; delete explicitly so both databases agree.
    await session.execute(sa.delete(TemplateOwner).where(TemplateOwner.template_id == template_id))
    await session.execute(sa.delete(TemplateTag).where(TemplateTag.template_id == template_id))


async def import_templates(session: AsyncSession, data: Any, registry: Registry) -> list[str]:
    """Import one template object or an array of them, all or nothing.

    An item carrying an ``id`` (or ``_id``, as exported elsewhere) replaces the
    stored template with that id or is created under it, so importing the same
    file twice does not duplicate templates. Every problem of every item is
    reported together, prefixed with the item's index.
    """
    items = data if isinstance(data, list) else [data]
    if len(items) > MAX_IMPORT:
        raise InvalidInput(f"At most {MAX_IMPORT} templates can be imported at once.")
    problems: list[Problem] = []
    prepared: list[tuple[str | None, dict[str, Any]]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        prefix = f"[{i}]" if isinstance(data, list) else ""
        given = (item.get("id") or item.get("_id")) if isinstance(item, dict) else None
        if given is not None:
            field = f"{prefix}.id" if prefix else "id"
            if not isinstance(given, str) or not is_valid_id(given):
                problems.append(Problem(f"{field}: must be 24 hex characters", field))
            elif given in seen:
                problems.append(Problem(f"{field}: {given} appears more than once", field))
            else:
                seen.add(given)
        clean, item_problems = _validate(item, registry, prefix)
        problems += item_problems
        prepared.append((given if isinstance(given, str) else None, clean))
    if problems:
        raise InvalidInput(problems)
    ids: list[str] = []
    for given, clean in prepared:
        existing = await session.get(Template, given, with_for_update=True) if given else None
        if existing is not None:
            _apply(existing, clean)
            existing.updated_at = utcnow()
            template = existing
        else:
            template = _new(clean, None, given)
            session.add(template)
        await session.flush()
        await _write_side_tables(session, template, replace=existing is not None)
        ids.append(template.id)
    return ids


# -- flows from templates ---------------------------------------------------------


def _flow_body(template: Template, overrides: Any) -> dict[str, Any]:
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise InvalidInput("The body must be a JSON object.")
    problems = [
        Problem(f"{key}: is not a known field (name, description, cron, fields)", key)
        for key in overrides
        if key not in _FROM_TEMPLATE_KEYS
    ]
    graph = copy.deepcopy(template.graph)
    nodes = {n.get("id"): n for n in graph.get("nodes", [])}
    fields = overrides.get("fields")
    if fields is not None:
        if not isinstance(fields, dict):
            problems.append(Problem("fields: must be an object keyed by node id", "fields"))
        else:
            for node_id, values in fields.items():
                if node_id not in nodes:
                    problems.append(
                        Problem(
                            f"fields.{node_id}: the template has no node {node_id!r}", f"fields.{node_id}"
                        )
                    )
                elif not isinstance(values, dict):
                    problems.append(Problem(f"fields.{node_id}: must be an object", f"fields.{node_id}"))
                else:
                    nodes[node_id]["fields"] = {**(nodes[node_id].get("fields") or {}), **values}
    if problems:
        raise InvalidInput(problems)
    body: dict[str, Any] = {
        "name": template.name,
        "description": template.description,
        "type": template.type,
        "cron": template.cron,
        "graph": graph,
    }
    for key in ("name", "description", "cron"):
        if key in overrides:
            body[key] = overrides[key]
    return body


async def create_flow_from_template(
    session: AsyncSession, principal: Principal, template_id: str, overrides: Any, registry: Registry
) -> Flow:
    """An inactive flow owned by the caller (and its tenant), built from a visible template.

    The template's owners say who may see the template, not who owns flows made
    from it, so they are not copied.
    """
    principal.require(perms.TEMPLATES_READ, perms.FLOWS_CREATE)
    template = await get_template(session, principal, template_id)
    flow = flows.prepare_new_flow(principal, _flow_body(template, overrides), registry)
    flow.from_template = template.id
    await flows.check_new_flow(session, principal, flow)
    await flows.insert_flows(session, [flow])
    return flow
