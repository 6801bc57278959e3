"""The permission matrix (issue 7): one table, every route of the app by every kind of caller ->
the expected status; for every refused request, nothing in the database changed. SQLite and
PostgreSQL.

A route of the app without a row fails ``test_every_route_has_a_row``; a row whose route is
gone fails it too. Callers (``WHO``):

- ``admin``: holds ``all``, no tenant (as the first administrator on the embedded default);
- ``with``: a member of tenant A holding the row's permissions;
- ``without``: a member of tenant A holding no permission;
- ``other``: a member of tenant B holding the row's permissions;
- ``tenantless``: a user without a tenant holding the row's permissions;
- ``narrowed``: a token of a tenant-A member holding the row's permissions, narrowed to one
  unrelated permission (``iam.key.read``, which no endpoint checks);
- ``admin_narrowed``: the administrator's token narrowed the same way;
- ``anonymous``: no token.

Objects a row acts on are made by the administrator in tenant A just before the call, so a
write that succeeds for one caller cannot change what another caller's case sees.

``DENIED`` (403 or 404) is expected where a caller both lacks the permission and cannot see
the object: SPEC §1 makes either answer right.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from argon2 import PasswordHasher
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from flowyard.db.session import Database
from flowyard.iam import passwords
from flowyard.models import metadata
from flowyard.webhooks import fastpath
from tests.conftest import Account, Factory, flow_body, force_status

WHO = ("admin", "with", "without", "other", "tenantless", "narrowed", "admin_narrowed", "anonymous")
UNRELATED = "iam.key.read"
DENIED = frozenset({403, 404})
Expected = int | frozenset[int]


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passwords, "_hasher", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


# -- the callers' world ----------------------------------------------------------------------


@dataclass
class Ctx:
    client: httpx.AsyncClient
    db: Database
    factory: Factory
    admin: Account
    tenant_a: str
    tenant_b: str
    who: str = ""
    caller: Account | None = None  # the user behind the caller's token (None: anonymous)
    headers: dict[str, str] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.counter)}"

    async def as_admin(self, method: str, url: str, json: Any = None) -> dict[str, Any]:
        r = await self.client.request(method, url, json=json, headers=self.admin.headers)
        assert r.status_code in (200, 201, 202), (method, url, r.text)
        body: dict[str, Any] = r.json()
        return body

    async def flow(self, *, status: str = "inactive") -> str:
        fid = str((await self.as_admin("POST", "/flows", flow_body(tenant=self.tenant_a)))["data"]["id"])
        if status != "inactive":
            await force_status(self.db, fid, status)
        return fid

    async def execution(self) -> str:
        fid = await self.flow(status="active")
        return str((await self.as_admin("POST", f"/flows/{fid}/executions", {}))["data"]["executionId"])

    async def template(self) -> str:
        body = flow_body(self.unique("template"), owners=[{"id": self.tenant_a, "type": "tenant"}])
        body["status"] = "published"
        return str((await self.as_admin("POST", "/templates", body))["data"]["id"])

    async def secret(self) -> str:
        body = {"name": self.unique("secret"), "value": {"token": "s3cret"}, "tenant": self.tenant_a}
        return str((await self.as_admin("POST", "/secrets", body))["data"]["id"])

    async def role(self, permissions: list[str], *, scope: str | None = "A") -> str:
        body: dict[str, Any] = {"name": self.unique("role"), "permissions": permissions}
        if scope == "A":
            body["scope"] = self.tenant_a
        return str((await self.as_admin("POST", "/roles", body))["data"]["id"])

    async def member_of_a(self) -> tuple[str, str, str]:
        """A tenant-A user: (id, username, password)."""
        username, password = f"{self.unique('target')}@example.com", "target password"
        body = {"username": username, "password": password, "tenant": self.tenant_a}
        return str((await self.as_admin("POST", "/api/users", body))["id"]), username, password

    async def token_of(self, user_id: str) -> tuple[str, str]:
        """A new API token of a user, made by the administrator: (id, text)."""
        data = (await self.as_admin("POST", "/tokens", {"description": "target", "user": user_id}))["data"]
        return str(data["id"]), str(data["token"])

    @property
    def caller_id(self) -> str:
        """The user the caller acts as (the administrator stands in for the anonymous caller)."""
        return (self.caller or self.admin).id


async def make_caller(ctx: Ctx, who: str, needs: tuple[str, ...]) -> None:
    held = [*needs, UNRELATED]
    f = ctx.factory
    account: Account | None
    if who in ("admin", "admin_narrowed"):
        account = ctx.admin
    elif who == "with":
        account = await f.user(tenant=ctx.tenant_a, permissions=held)
    elif who == "without":
        account = await f.user(tenant=ctx.tenant_a, permissions=[])
    elif who == "other":
        account = await f.user(tenant=ctx.tenant_b, permissions=held)
    elif who == "tenantless":
        account = await f.user(tenant=None, permissions=held)
    elif who == "narrowed":
        account = await f.user(tenant=ctx.tenant_a, permissions=held)
    else:
        account = None
    ctx.who, ctx.caller = who, account
    ctx.headers = {}
    if account is not None:
        # A token of its own (made by the administrator), so that logging out or deleting it
        # leaves the accounts the world is built with working.
        narrowed = who in ("narrowed", "admin_narrowed")
        body = {"user": account.id, **({"permissions": [UNRELATED]} if narrowed else {})}
        data = (await ctx.as_admin("POST", "/tokens", body))["data"]
        if narrowed:
            assert data["permissions"] == [UNRELATED], data
        ctx.headers = {"Authorization": f"Bearer {data['token']}"}


async def snapshot(db: Database) -> dict[str, list[str]]:
    """Every row of every table."""
    out: dict[str, list[str]] = {}
    async with db.read() as session:
        for table in metadata.sorted_tables:
            rows = (await session.execute(sa.select(table))).all()
            out[table.name] = sorted(repr(tuple(row)) for row in rows)
    return out


# -- the table ---------------------------------------------------------------------------------

Request = tuple[str, Any]  # (url with query, JSON body or None)
Build = Callable[[Ctx], Awaitable[Request]]


@dataclass(frozen=True)
class Row:
    method: str
    path: str  # the route's path as declared
    scenario: str
    needs: tuple[str, ...]  # held by the with, other, tenantless and narrowed callers
    expect: dict[str, Expected]
    build: Build


def _expect(
    admin: Expected,
    with_: Expected,
    without: Expected,
    other: Expected,
    tenantless: Expected,
    narrowed: Expected,
    admin_narrowed: Expected,
    anonymous: Expected = 401,
) -> dict[str, Expected]:
    values = (admin, with_, without, other, tenantless, narrowed, admin_narrowed, anonymous)
    return dict(zip(WHO, values, strict=True))


def public(status: int) -> dict[str, Expected]:
    """No token needed; a token changes nothing."""
    return dict.fromkeys(WHO, status)


def any_caller(status: int) -> dict[str, Expected]:
    """Any authenticated caller, no permission needed (its scope is tested elsewhere)."""
    return {**dict.fromkeys(WHO, status), "anonymous": 401}


def own_scope(ok: int) -> dict[str, Expected]:
    """Needs the permission; acts in the caller's own scope (list, create)."""
    return _expect(ok, ok, 403, ok, ok, 403, 403)


def tenant_object(ok: int) -> dict[str, Expected]:
    """Needs the permission and an object of tenant A visible to the caller."""
    return _expect(ok, ok, 403, 404, 404, 403, 403)


def admin_only(ok: int) -> dict[str, Expected]:
    return _expect(ok, 403, 403, 403, 403, 403, 403)


def url(path: str) -> Build:
    async def build(ctx: Ctx) -> Request:
        return path, None

    return build


def with_body(path: str, body: Callable[[Ctx], Any]) -> Build:
    async def build(ctx: Ctx) -> Request:
        return path, body(ctx)

    return build


def on(make: Callable[[Ctx], Awaitable[str]], path: str, body: Any = None) -> Build:
    """``path`` with ``{id}`` replaced by a target made just before the call."""

    async def build(ctx: Ctx) -> Request:
        return path.replace("{id}", await make(ctx)), body

    return build


async def _flow(ctx: Ctx) -> str:
    return await ctx.flow()


async def _active_flow(ctx: Ctx) -> str:
    return await ctx.flow(status="active")


async def _execution(ctx: Ctx) -> str:
    return await ctx.execution()


async def _cancelled_execution(ctx: Ctx) -> str:
    eid = await ctx.execution()
    await ctx.as_admin("POST", f"/executions/{eid}/cancel")
    return eid


async def _template(ctx: Ctx) -> str:
    return await ctx.template()


async def _secret(ctx: Ctx) -> str:
    return await ctx.secret()


async def _role(ctx: Ctx) -> str:
    return await ctx.role(["tenant.flows.read"])


async def _member(ctx: Ctx) -> str:
    return (await ctx.member_of_a())[0]


async def _admin_user(ctx: Ctx) -> str:
    return ctx.admin.id


async def _own_token(ctx: Ctx) -> str:
    return (await ctx.token_of(ctx.caller_id))[0]


async def _login(ctx: Ctx) -> Request:
    _id, username, password = await ctx.member_of_a()
    return "/login", {"username": username, "password": password}


async def _introspect(ctx: Ctx) -> Request:
    _token, text = await ctx.token_of(await _member(ctx))
    return "/tokens/introspect", {"token": text}


async def _new_user(ctx: Ctx, **extra: Any) -> dict[str, Any]:
    return {"username": f"{ctx.unique('new')}@example.com", "password": "a new password", **extra}


async def _user_in_a(ctx: Ctx) -> Request:
    return "/api/users", await _new_user(ctx, tenant=ctx.tenant_a)


async def _user_in_own_tenant(ctx: Ctx) -> Request:
    return "/api/users", await _new_user(ctx)


async def _user_with_wide_role(ctx: Ctx) -> Request:
    role = await ctx.role(["tenant.all"])
    return "/api/users", await _new_user(ctx, tenant=ctx.tenant_a, roles=[role])


async def _own_wide_role(ctx: Ctx) -> Request:
    role = await ctx.role(["tenant.all"], scope=None)  # global: valid for every user
    return f"/api/users/{ctx.caller_id}", {"roles": [role]}


async def _logs_of_a(ctx: Ctx) -> Request:
    await ctx.execution()
    return f"/logs?filter[tenant]={ctx.tenant_a}", None


async def _logs_of_admin(ctx: Ctx) -> Request:
    return f"/logs?filter[tenant]={ctx.admin.id}", None


def _tpl(ctx: Ctx) -> dict[str, Any]:
    return flow_body(ctx.unique("template"))


CHANGE = {"description": "changed"}
FLOWS_READ, FLOWS_CREATE, FLOWS_UPDATE, FLOWS_DELETE = (
    "tenant.flows.read",
    "tenant.flows.create",
    "tenant.flows.update",
    "tenant.flows.delete",
)

ROWS: list[Row] = [
    # public
    Row("GET", "/openapi.json", "document", (), public(200), url("/openapi.json")),
    Row("GET", "/docs", "page", (), public(200), url("/docs")),
    Row("GET", "/docs/oauth2-redirect", "page", (), public(200), url("/docs/oauth2-redirect")),
    Row("GET", "/redoc", "page", (), public(200), url("/redoc")),
    Row("GET", "/", "redirect", (), public(307), url("/")),
    Row("GET", "/console", "redirect", (), public(308), url("/console")),
    Row("GET", "/console/", "page", (), public(200), url("/console/")),
    Row("GET", "/health", "alive", (), public(200), url("/health")),
    Row("GET", "/health/ready", "ready", (), public(200), url("/health/ready")),
    # From loopback without FLOWYARD_METRICS_TOKEN, as here; its access rule: tests/api/test_metrics.py.
    Row("GET", "/metrics", "scrape", (), public(200), url("/metrics")),
    Row("POST", "/login", "a tenant-A user's password", (), public(200), _login),
    Row("POST", "/webhooks/{flowId}", "active flow", (), public(202), on(_active_flow, "/webhooks/{id}", {})),
    Row("POST", "/webhooks/{flowId}", "inactive flow", (), public(404), on(_flow, "/webhooks/{id}", {})),
    # tokens
    Row("POST", "/logout", "own token", (), any_caller(200), url("/logout")),
    Row(
        "POST",
        "/tokens",
        "for oneself",
        ("iam.token.create",),
        own_scope(201),
        with_body("/tokens", lambda c: {"description": "m"}),
    ),
    Row("GET", "/tokens", "own tokens", (), any_caller(200), url("/tokens")),
    Row(
        "DELETE",
        "/tokens/{id}",
        "another token of one's own",
        ("iam.token.delete",),
        own_scope(200),
        on(_own_token, "/tokens/{id}"),
    ),
    Row(
        "POST",
        "/tokens/introspect",
        "a tenant-A user's token",
        ("iam.token.introspect",),
        own_scope(200),
        _introspect,
    ),
    # users
    *(
        Row("GET", path, "list", (), any_caller(200), url(path))
        for path in ("/api/users", "/users", "/users/")
    ),
    *(
        Row(
            "GET",
            path,
            "a tenant-A user",
            (),
            _expect(200, 200, 200, 404, 404, 200, 404),
            on(_member, path),
        )
        for path in ("/api/users/{id}", "/users/{id}")
    ),
    Row(
        "POST",
        "/api/users",
        "in tenant A",
        ("iam.account.create",),
        _expect(201, 201, 403, 403, 403, 403, 403),
        _user_in_a,
    ),
    Row(
        "POST",
        "/api/users",
        "in the caller's tenant (none for tenantless callers)",
        ("iam.account.create",),
        _expect(201, 201, 403, 201, 403, 403, 403),
        _user_in_own_tenant,
    ),
    Row(
        "POST",
        "/api/users",
        "with a role granting tenant.all",
        ("iam.account.create",),
        _expect(201, 403, 403, 403, 403, 403, 403),
        _user_with_wide_role,
    ),
    Row(
        "PATCH",
        "/api/users/{id}",
        "a tenant-A user's name",
        ("iam.account.update",),
        _expect(200, 200, 403, 404, 404, 403, DENIED),
        on(_member, "/api/users/{id}", {"lastname": "changed"}),
    ),
    Row(
        "PATCH",
        "/api/users/{id}",
        "the administrator's name",
        ("iam.account.read", "iam.account.update"),
        # iam.account.read sees every user, so refusing to act on the administrator is a 403
        _expect(200, 403, DENIED, 403, 403, DENIED, 200),
        on(_admin_user, "/api/users/{id}", {"lastname": "changed"}),
    ),
    Row(
        "PATCH",
        "/api/users/{id}",
        "own roles: a global role granting tenant.all",
        ("iam.account.update",),
        _expect(200, 403, 403, 403, 403, 403, 403),
        _own_wide_role,
    ),
    Row(
        "DELETE",
        "/api/users/{id}",
        "a tenant-A user",
        ("iam.account.delete",),
        _expect(200, 200, 403, 404, 404, 403, DENIED),
        on(_member, "/api/users/{id}"),
    ),
    # tenants and roles
    Row(
        "POST",
        "/tenants",
        "new",
        ("iam.tenant.create",),
        own_scope(201),
        with_body("/tenants", lambda c: {"name": c.unique("tenant")}),
    ),
    Row("GET", "/tenants", "list", (), any_caller(200), url("/tenants")),
    Row("GET", "/roles", "list", ("tenant.roles.read",), own_scope(200), url("/roles")),
    Row(
        "POST",
        "/roles",
        "in the caller's tenant",
        ("tenant.roles.create", FLOWS_READ),
        _expect(201, 201, 403, 201, 403, 403, 403),
        with_body("/roles", lambda c: {"name": c.unique("role"), "permissions": [FLOWS_READ]}),
    ),
    Row(
        "GET",
        "/roles/{id}",
        "tenant A's",
        ("tenant.roles.read",),
        tenant_object(200),
        on(_role, "/roles/{id}"),
    ),
    Row(
        "PATCH",
        "/roles/{id}",
        "tenant A's",
        ("tenant.roles.read", "tenant.roles.update"),
        tenant_object(200),
        on(_role, "/roles/{id}", CHANGE),
    ),
    Row(
        "DELETE",
        "/roles/{id}",
        "tenant A's",
        ("tenant.roles.read", "tenant.roles.delete"),
        tenant_object(200),
        on(_role, "/roles/{id}"),
    ),
    # flows
    Row(
        "POST",
        "/flows",
        "in the caller's tenant",
        (FLOWS_CREATE,),
        own_scope(201),
        with_body("/flows", lambda c: flow_body()),
    ),
    Row(
        "POST",
        "/flows",
        "naming tenant A",
        (FLOWS_CREATE,),
        _expect(201, 201, 403, 403, 403, 403, 403),
        with_body("/flows", lambda c: flow_body(tenant=c.tenant_a)),
    ),
    Row("GET", "/flows", "list", (FLOWS_READ,), own_scope(200), url("/flows")),
    Row("GET", "/flows/{id}", "tenant A's", (FLOWS_READ,), tenant_object(200), on(_flow, "/flows/{id}")),
    Row(
        "PATCH",
        "/flows/{id}",
        "tenant A's",
        (FLOWS_UPDATE,),
        tenant_object(200),
        on(_flow, "/flows/{id}", CHANGE),
    ),
    Row("DELETE", "/flows/{id}", "tenant A's", (FLOWS_DELETE,), tenant_object(200), on(_flow, "/flows/{id}")),
    Row(
        "POST",
        "/flows/{id}/start",
        "tenant A's, inactive",
        (FLOWS_UPDATE,),
        tenant_object(200),
        on(_flow, "/flows/{id}/start"),
    ),
    Row(
        "POST",
        "/flows/{id}/stop",
        "tenant A's, active",
        (FLOWS_UPDATE,),
        tenant_object(200),
        on(_active_flow, "/flows/{id}/stop"),
    ),
    # versions, export and import (SPEC §12)
    Row(
        "GET",
        "/flows/{id}/versions",
        "tenant A's",
        (FLOWS_READ,),
        tenant_object(200),
        on(_flow, "/flows/{id}/versions"),
    ),
    Row(
        "GET",
        "/flows/{id}/versions/{number}",
        "tenant A's, version 1",
        (FLOWS_READ,),
        tenant_object(200),
        on(_flow, "/flows/{id}/versions/1"),
    ),
    Row(
        "POST",
        "/flows/{id}/versions/{number}/restore",
        "tenant A's, inactive, version 1",
        (FLOWS_UPDATE,),
        tenant_object(200),
        on(_flow, "/flows/{id}/versions/1/restore"),
    ),
    Row(
        "GET",
        "/flows/{id}/export",
        "tenant A's",
        (FLOWS_READ,),
        tenant_object(200),
        on(_flow, "/flows/{id}/export"),
    ),
    Row(
        "POST",
        "/flows/import",
        "in the caller's tenant",
        (FLOWS_CREATE,),
        own_scope(201),
        with_body("/flows/import", lambda c: {"flowyard": 1, **flow_body()}),
    ),
    # executions, counts, logs
    Row(
        "POST",
        "/flows/{id}/executions",
        "tenant A's, active",
        (FLOWS_UPDATE,),
        tenant_object(202),
        on(_active_flow, "/flows/{id}/executions", {"n": 1}),
    ),
    Row(
        "POST",
        "/flows/{id}/test-step",
        "tenant A's, a jsonata step",
        (FLOWS_UPDATE,),
        tenant_object(200),
        on(
            _flow,
            "/flows/{id}/test-step",
            {
                "node": {"id": "t", "componentId": "jsonata", "fields": {"expression": "n + 1"}},
                "data": {"n": 1},
            },
        ),
    ),
    Row(
        "GET",
        "/flows/{id}/executions",
        "tenant A's",
        (FLOWS_READ,),
        tenant_object(200),
        on(_flow, "/flows/{id}/executions"),
    ),
    Row("GET", "/executions", "list", (FLOWS_READ,), own_scope(200), url("/executions")),
    Row(
        "GET",
        "/executions/{id}",
        "of tenant A's flow",
        (FLOWS_READ,),
        tenant_object(200),
        on(_execution, "/executions/{id}"),
    ),
    Row(
        "POST",
        "/executions/{id}/cancel",
        "queued, of tenant A's flow",
        (FLOWS_UPDATE,),
        tenant_object(200),
        on(_execution, "/executions/{id}/cancel"),
    ),
    Row(
        "POST",
        "/executions/{id}/retry",
        "cancelled, of tenant A's active flow",
        (FLOWS_UPDATE,),
        tenant_object(202),
        on(_cancelled_execution, "/executions/{id}/retry"),
    ),
    Row(
        "POST",
        "/executions/{id}/rerun",
        "cancelled, of tenant A's active flow",
        (FLOWS_UPDATE,),
        tenant_object(202),
        on(_cancelled_execution, "/executions/{id}/rerun"),
    ),
    Row("GET", "/icenter/executions", "counts", (), any_caller(200), url("/icenter/executions")),
    Row("GET", "/logs", "naming tenant A", (), _expect(200, 200, 200, 403, 403, 200, 403), _logs_of_a),
    Row(
        "GET",
        "/logs",
        "naming the administrator (its flows without a tenant)",
        (),
        _expect(200, 403, 403, 403, 403, 403, 200),
        _logs_of_admin,
    ),
    # templates
    Row("GET", "/templates", "list", ("flowTemplates.read",), own_scope(200), url("/templates")),
    Row(
        "GET",
        "/templates/{id}",
        "tenant A's",
        ("flowTemplates.read",),
        tenant_object(200),
        on(_template, "/templates/{id}"),
    ),
    Row("POST", "/templates", "new", ("flowTemplates.read",), admin_only(201), with_body("/templates", _tpl)),
    Row(
        "PATCH",
        "/templates/{id}",
        "tenant A's",
        ("flowTemplates.read",),
        admin_only(200),
        on(_template, "/templates/{id}", CHANGE),
    ),
    Row(
        "DELETE",
        "/templates/{id}",
        "tenant A's",
        ("flowTemplates.read",),
        admin_only(200),
        on(_template, "/templates/{id}"),
    ),
    Row(
        "POST",
        "/templates/{id}/flows",
        "tenant A's",
        ("flowTemplates.read", FLOWS_CREATE),
        tenant_object(201),
        on(_template, "/templates/{id}/flows", {}),
    ),
    # secrets
    Row(
        "POST",
        "/secrets",
        "in the caller's tenant",
        ("iam.secret.create",),
        own_scope(201),
        with_body("/secrets", lambda c: {"name": c.unique("secret"), "value": {"token": "t"}}),
    ),
    Row("GET", "/secrets", "list", ("iam.secret.read",), own_scope(200), url("/secrets")),
    Row(
        "PUT",
        "/secrets/{id}",
        "tenant A's, rotated",
        ("iam.secret.create",),
        tenant_object(200),
        on(_secret, "/secrets/{id}", {"value": {"token": "rotated"}}),
    ),
    Row(
        "DELETE",
        "/secrets/{id}",
        "tenant A's",
        ("iam.secret.create",),
        tenant_object(200),
        on(_secret, "/secrets/{id}"),
    ),
    # components
    Row("GET", "/components", "installed", (), any_caller(200), url("/components")),
]


def _cases() -> list[Any]:
    """One case per row, every caller in turn."""
    cases = []
    for row in ROWS:
        assert set(row.expect) == set(WHO), row
        cases.append(pytest.param(row, WHO, id=f"{row.method} {row.path} [{row.scenario}]"))
    return cases


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """The app's routes plus what the webhook fast path serves in front of them."""
    return {
        (method, ctx.path)
        for ctx in iter_route_contexts(app.routes)
        for method in (getattr(ctx, "methods", None) or ())
        if method != "HEAD"
    } | set(fastpath.ROUTES)


async def test_every_route_has_a_row(app: FastAPI) -> None:
    routes = app_routes(app)
    assert len(routes) > 40, routes
    covered = {(row.method, row.path) for row in ROWS}
    assert sorted(routes - covered) == [], "routes without a row in the permission matrix"
    assert sorted(covered - routes) == [], "rows naming routes the app does not have"


@pytest.mark.parametrize(("row", "callers"), _cases())
async def test_permission_matrix(
    row: Row,
    callers: tuple[str, ...],
    client: httpx.AsyncClient,
    db: Database,
    factory: Factory,
    admin: Account,
) -> None:
    """Each caller in turn in one world; every caller acts on targets made for it alone."""
    ctx = Ctx(client, db, factory, admin, await factory.tenant("tenant-a"), await factory.tenant("tenant-b"))
    wrong = []
    for who in callers:
        await make_caller(ctx, who, row.needs)
        path, body = await row.build(ctx)
        expected = row.expect[who]
        allowed = expected if isinstance(expected, frozenset) else frozenset({expected})
        refused = min(allowed) >= 400
        before = await snapshot(db) if refused else None
        r = await client.request(row.method, path, json=body, headers=ctx.headers)
        if r.status_code not in allowed:
            wrong.append(f"{who}: {r.status_code}, expected {expected}: {r.text[:200]}")
        elif refused and await snapshot(db) != before:
            wrong.append(f"{who}: refused with {r.status_code} but data changed")
    assert not wrong, f"{row.method} {row.path} [{row.scenario}]\n" + "\n".join(wrong)
