"""Login, tokens, users, tenants and roles over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.iam import service as iam
from flowyard.iam.models import Token
from tests.conftest import Account, Factory

MISSING = "0123456789abcdef01234567"
SECRET_KEYS = {"password", "password_hash", "passwordHash", "hash", "token_hash", "tokenHash"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_no_secrets(value: Any, password: str | None = None) -> None:
    """No password, hash or token hash anywhere in a response, at any depth."""
    if isinstance(value, dict):
        assert not SECRET_KEYS & set(value), value
        for v in value.values():
            assert_no_secrets(v, password)
    elif isinstance(value, list):
        for v in value:
            assert_no_secrets(v, password)
    elif isinstance(value, str):
        assert not value.startswith("$argon2"), value
        if password:
            assert password not in value


async def login(client: httpx.AsyncClient, username: str, password: str) -> httpx.Response:
    return await client.post("/login", json={"username": username, "password": password})


# -- login and logout --------------------------------------------------------------------


async def test_login_returns_a_bare_access_token(client: httpx.AsyncClient, factory: Factory) -> None:
    user = await factory.user(username="Ann@Example.com")
    r = await login(client, "ann@example.com", user.password)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"token", "id"}
    assert len(body["token"]) >= 43 and len(body["id"]) == 24
    r = await client.get("/api/users/" + user.id, headers=bearer(body["token"]))
    assert r.status_code == 200
    assert r.json()["username"] == "ann@example.com"


async def test_wrong_username_and_password_look_the_same(client: httpx.AsyncClient, factory: Factory) -> None:
    user = await factory.user()
    wrong_password = await login(client, user.username, "not the password")
    wrong_user = await login(client, "nobody@example.com", user.password)
    assert wrong_password.status_code == wrong_user.status_code == 401
    assert wrong_password.json() == wrong_user.json()
    assert wrong_password.json()["errors"][0]["code"] == 401


async def test_login_body_is_validated(client: httpx.AsyncClient) -> None:
    r = await client.post("/login", json={"username": "", "extra": 1})
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {"username", "password", "extra"}
    r = await client.post(
        "/login", content=b"username=a", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 415


async def test_disabled_users_cannot_log_in_and_pending_can(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    disabled = await factory.user()
    pending = await factory.user()
    for who, status in ((disabled, "DISABLED"), (pending, "PENDING")):
        r = await client.patch(f"/api/users/{who.id}", json={"status": status}, headers=admin.headers)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == status
    r = await login(client, disabled.username, disabled.password)
    assert r.status_code == 401
    assert r.json() == (await login(client, "nobody@example.com", "x")).json()
    # Disabling revokes the tokens it already had.
    assert (await client.get("/tokens", headers=disabled.headers)).status_code == 401
    r = await login(client, pending.username, pending.password)
    assert r.status_code == 200
    assert (await client.get("/tokens", headers=bearer(r.json()["token"]))).status_code == 200


async def test_logout_revokes_the_session(client: httpx.AsyncClient, factory: Factory) -> None:
    user = await factory.user()
    token = (await login(client, user.username, user.password)).json()["token"]
    assert (await client.get("/tokens", headers=bearer(token))).status_code == 200
    r = await client.post("/logout", headers=bearer(token))
    assert (r.status_code, r.json()) == (200, {})
    r = await client.get("/tokens", headers=bearer(token))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    # Other tokens of the same user still work.
    assert (await client.get("/tokens", headers=user.headers)).status_code == 200


async def test_missing_or_bad_tokens(client: httpx.AsyncClient) -> None:
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Basic abc"}, bearer("fy_nonsense")):
        r = await client.get("/api/users", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["errors"][0]["code"] == 401


# -- tokens ------------------------------------------------------------------------------


async def test_api_tokens(client: httpx.AsyncClient, factory: Factory) -> None:
    user = await factory.user()
    r = await client.post(
        "/tokens",
        json={"description": "ci", "expiresAt": (utcnow() + timedelta(days=1)).isoformat()},
        headers=user.headers,
    )
    assert r.status_code == 201, r.text
    created = r.json()["data"]
    assert r.json()["meta"] == {}
    assert created["description"] == "ci" and created["kind"] == "api" and created["user"] == user.id
    assert created["expiresAt"].endswith("Z")
    text = created["token"]

    r = await client.get("/tokens", headers=bearer(text))
    assert r.status_code == 200
    listed = r.json()["data"]
    assert created["id"] in [t["id"] for t in listed]
    assert all("token" not in t for t in listed)
    assert text not in r.text
    assert_no_secrets(r.json())

    r = await client.delete(f"/tokens/{created['id']}", headers=user.headers)
    assert (r.status_code, r.json()) == (200, {})
    assert (await client.get("/tokens", headers=bearer(text))).status_code == 401
    assert (await client.delete(f"/tokens/{created['id']}", headers=user.headers)).status_code == 404
    assert (await client.delete("/tokens/not-an-id", headers=user.headers)).status_code == 400


async def test_token_creation_rules(client: httpx.AsyncClient, factory: Factory) -> None:
    tenant = await factory.tenant()
    user = await factory.user(tenant=tenant)
    other = await factory.user(tenant=tenant)
    cannot = await factory.user(tenant=tenant, permissions=["tenant.flows.read"])
    assert (await client.post("/tokens", json={}, headers=cannot.headers)).status_code == 403
    past = (utcnow() - timedelta(minutes=1)).isoformat()
    r = await client.post("/tokens", json={"expiresAt": past}, headers=user.headers)
    assert r.status_code == 400
    r = await client.post("/tokens", json={"permissions": ["no.such"]}, headers=user.headers)
    assert r.status_code == 400
    r = await client.post("/tokens", json={"user": other.id}, headers=user.headers)
    assert r.status_code == 403
    # A timestamp without a zone is read as UTC, not a server error.
    naive = (utcnow() + timedelta(hours=1)).replace(tzinfo=None).isoformat()
    r = await client.post("/tokens", json={"expiresAt": naive}, headers=user.headers)
    assert r.status_code == 201, r.text


async def test_narrowed_tokens(client: httpx.AsyncClient, factory: Factory) -> None:
    tenant = await factory.tenant()
    user = await factory.user(tenant=tenant)  # member defaults: flows, templates, token create/delete
    r = await client.post("/tokens", json={"permissions": ["iam.account.create"]}, headers=user.headers)
    assert r.status_code == 403
    assert "iam.account.create" in r.json()["errors"][0]["message"]
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=user.headers)
    assert r.status_code == 201
    narrow = r.json()["data"]["token"]
    assert (await client.get("/flows", headers=bearer(narrow))).status_code == 200
    assert (await client.get("/templates", headers=bearer(narrow))).status_code == 403
    # A narrowed token cannot mint a broader one (it lacks iam.token.create altogether).
    assert (await client.post("/tokens", json={}, headers=bearer(narrow))).status_code == 403


async def test_narrowing_works_under_all_and_tenant_all(client: httpx.AsyncClient, factory: Factory) -> None:
    tenant = await factory.tenant()
    admin = await factory.admin()
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=admin.headers)
    assert r.status_code == 201
    token = r.json()["data"]["token"]
    assert (await client.get("/flows", headers=bearer(token))).status_code == 200
    assert (await client.post("/tenants", json={"name": "x"}, headers=bearer(token))).status_code == 403

    lead = await factory.user(tenant=tenant, permissions=["tenant.all", "iam.token.create"])
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=lead.headers)
    assert r.status_code == 201
    token = r.json()["data"]["token"]
    assert (await client.get("/flows", headers=bearer(token))).status_code == 200
    assert (await client.get("/roles", headers=bearer(token))).status_code == 403


async def test_expired_tokens_are_refused(client: httpx.AsyncClient, factory: Factory, db: Database) -> None:
    user = await factory.user()
    session_token = (await login(client, user.username, user.password)).json()
    r = await client.post(
        "/tokens", json={"expiresAt": (utcnow() + timedelta(hours=1)).isoformat()}, headers=user.headers
    )
    api_token = r.json()["data"]
    async with db.write() as session:
        await session.execute(
            sa.update(Token)
            .where(Token.id.in_([session_token["id"], api_token["id"]]))
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    for text in (session_token["token"], api_token["token"]):
        r = await client.get("/tokens", headers=bearer(text))
        assert r.status_code == 401
        assert r.json()["errors"][0]["message"] == "Token expired."
    assert (await client.get("/tokens", headers=user.headers)).status_code == 200


async def test_introspect(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    tenant = await factory.tenant()
    user = await factory.user(tenant=tenant)
    assert (
        await client.post("/tokens/introspect", json={"token": user.token}, headers=user.headers)
    ).status_code == 403
    r = await client.post("/tokens/introspect", json={"token": user.token}, headers=admin.headers)
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["active"] is True
    assert data["user"]["id"] == user.id and data["user"]["tenant"] == tenant
    assert "flowTemplates.read" in data["permissions"]
    assert_no_secrets(r.json(), user.password)
    r = await client.post("/tokens/introspect", json={"token": "fy_unknown"}, headers=admin.headers)
    assert r.json() == {"data": {"active": False, "permissions": []}, "meta": {}}
    assert (await client.post("/tokens/introspect", json={}, headers=admin.headers)).status_code == 400


# -- users --------------------------------------------------------------------------------


async def test_user_listing_shapes(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    users = [admin] + [await factory.user() for _ in range(4)]
    all_ids = sorted(u.id for u in users)
    r = await client.get("/api/users", headers=admin.headers)
    assert r.status_code == 200
    assert isinstance(r.json(), list)
    assert [u["id"] for u in r.json()] == all_ids
    assert_no_secrets(r.json(), admin.password)
    for path in ("/users", "/users/"):
        r2 = await client.get(path, headers=admin.headers)
        assert r2.status_code == 200 and r2.json() == r.json(), path

    r = await client.get("/api/users?meta=true&page[size]=2&page[number]=2", headers=admin.headers)
    body = r.json()
    assert [u["id"] for u in body["data"]] == all_ids[2:4]
    assert body["meta"] == {"page": 2, "perPage": 2, "total": 5, "totalPages": 3}
    r = await client.get("/users/?meta=true", headers=admin.headers)
    assert r.json()["meta"] == {"page": 1, "perPage": 10, "total": 5, "totalPages": 1}
    r = await client.get(f"/api/users?username={users[1].username.upper()}", headers=admin.headers)
    assert [u["id"] for u in r.json()] == [users[1].id]
    assert (await client.get("/api/users?meta=true&page[size]=0", headers=admin.headers)).status_code == 400
    assert (await client.get("/api/users?meta=maybe", headers=admin.headers)).status_code == 400


async def test_user_fields(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    tenant = await factory.tenant()
    async with factory.db.write() as session:
        role = await iam.create_role(session, name="viewers", permissions=["tenant.flows.read"], scope=tenant)
        role_id = role.id
    r = await client.post(
        "/api/users",
        json={
            "username": "Joe@Example.com",
            "password": "long enough pw",
            "firstname": "Joe",
            "lastname": "Doe",
            "tenant": tenant,
            "roles": [role_id],
            "permissions": ["flowTemplates.read"],
        },
        headers=admin.headers,
    )
    assert r.status_code == 201, r.text
    joe = r.json()
    assert set(joe) == {
        "id",
        "username",
        "firstname",
        "lastname",
        "status",
        "tenant",
        "roles",
        "permissions",
        "confirmed",
        "img",
        "canLogin",
        "createdAt",
        "updatedAt",
    }
    assert joe["username"] == "joe@example.com"
    assert joe["permissions"] == ["flowTemplates.read"]
    assert [ro["id"] for ro in joe["roles"]] == [role_id]
    assert joe["roles"][0]["permissions"] == ["tenant.flows.read"]
    assert joe["canLogin"] is True and joe["status"] == "ACTIVE"
    assert_no_secrets(joe, "long enough pw")
    # Effective permissions are the user's own plus those of its roles.
    token = (await login(client, "joe@example.com", "long enough pw")).json()["token"]
    assert (await client.get("/flows", headers=bearer(token))).status_code == 200
    assert (await client.get("/templates", headers=bearer(token))).status_code == 200
    r = await client.get(f"/api/users/{joe['id']}", headers=bearer(token))
    assert r.json() == joe
    r = await client.post(
        "/api/users", json={"username": "joe@example.com", "password": "x" * 8}, headers=admin.headers
    )
    assert r.status_code == 409
    r = await client.post("/api/users", json={"username": "nope", "password": "short"}, headers=admin.headers)
    assert r.status_code == 400
    assert {e["field"] for e in r.json()["errors"]} == {"username", "password"}


async def test_user_visibility(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    a = await factory.tenant()
    b = await factory.tenant()
    alice = await factory.user(tenant=a)
    bob = await factory.user(tenant=a)
    carol = await factory.user(tenant=b)
    loner = await factory.user()
    auditor = await factory.user(tenant=b, permissions=["iam.account.read"])

    async def listed(who: Account) -> list[str]:
        r = await client.get("/api/users", headers=who.headers)
        assert r.status_code == 200
        return [u["id"] for u in r.json()]

    assert await listed(alice) == sorted([alice.id, bob.id])
    assert await listed(carol) == sorted([carol.id, auditor.id])
    assert await listed(loner) == [loner.id]
    everyone = sorted([admin.id, alice.id, bob.id, carol.id, loner.id, auditor.id])
    assert await listed(auditor) == everyone
    assert await listed(admin) == everyone

    assert (await client.get(f"/api/users/{bob.id}", headers=alice.headers)).status_code == 200
    for hidden in (carol.id, loner.id, admin.id, MISSING):
        r = await client.get(f"/api/users/{hidden}", headers=alice.headers)
        assert r.status_code == 404, hidden
    assert (await client.get(f"/api/users/{loner.id}", headers=loner.headers)).status_code == 200
    assert (await client.get(f"/api/users/{alice.id}", headers=auditor.headers)).status_code == 200
    assert (await client.get(f"/users/{alice.id}", headers=auditor.headers)).status_code == 200
    assert (await client.get("/api/users/not-an-id", headers=admin.headers)).status_code == 400


async def test_user_management_permissions(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    a = await factory.tenant()
    b = await factory.tenant()
    manager = await factory.user(
        tenant=a,
        permissions=["iam.account.create", "iam.account.update", "iam.account.delete", "tenant.flows.read"],
    )
    member = await factory.user(tenant=a)
    outsider = await factory.user(tenant=b)
    new = {"username": "new@example.com", "password": "long enough pw"}

    assert (await client.post("/api/users", json=new, headers=member.headers)).status_code == 403
    r = await client.post("/api/users", json={**new, "tenant": b}, headers=manager.headers)
    assert r.status_code == 403
    r = await client.post("/api/users", json={**new, "permissions": ["all"]}, headers=manager.headers)
    assert r.status_code == 403
    r = await client.post(
        "/api/users", json={**new, "permissions": ["tenant.flows.read"]}, headers=manager.headers
    )
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["tenant"] == a

    # Anyone may edit their own name; status and permissions need iam.account.update.
    r = await client.patch(f"/api/users/{member.id}", json={"firstname": "Me"}, headers=member.headers)
    assert (r.status_code, r.json()["firstname"]) == (200, "Me")
    r = await client.patch(f"/api/users/{member.id}", json={"permissions": ["all"]}, headers=member.headers)
    assert r.status_code == 403
    r = await client.patch(f"/api/users/{created['id']}", json={"status": "PENDING"}, headers=manager.headers)
    assert (r.status_code, r.json()["status"]) == (200, "PENDING")
    r = await client.patch(f"/api/users/{created['id']}", json={"tenant": b}, headers=manager.headers)
    assert r.status_code == 403
    r = await client.patch(f"/api/users/{outsider.id}", json={"firstname": "x"}, headers=manager.headers)
    assert r.status_code == 404
    # A non-admin sets another user's password only by knowing the current one.
    r = await client.patch(
        f"/api/users/{created['id']}", json={"password": "another long pw"}, headers=manager.headers
    )
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "currentPassword"
    r = await client.patch(
        f"/api/users/{created['id']}",
        json={"password": "another long pw", "currentPassword": "long enough pw"},
        headers=manager.headers,
    )
    assert r.status_code == 200
    assert (await login(client, "new@example.com", "another long pw")).status_code == 200
    for field in ("password", "firstname", "permissions", "roles", "status"):
        r = await client.patch(f"/api/users/{created['id']}", json={field: None}, headers=manager.headers)
        assert r.status_code == 400, (field, r.text)

    assert (await client.delete(f"/api/users/{created['id']}", headers=member.headers)).status_code == 403
    assert (await client.delete(f"/api/users/{outsider.id}", headers=manager.headers)).status_code == 404
    assert (await client.delete(f"/api/users/{manager.id}", headers=manager.headers)).status_code == 409
    r = await client.delete(f"/api/users/{created['id']}", headers=manager.headers)
    assert (r.status_code, r.json()) == (200, {})
    assert (await client.get(f"/api/users/{created['id']}", headers=admin.headers)).status_code == 404
    r = await client.patch(f"/api/users/{outsider.id}", json={"tenant": a}, headers=admin.headers)
    assert (r.status_code, r.json()["tenant"]) == (200, a)


# -- tenants and roles ----------------------------------------------------------------------


async def test_tenants(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    r = await client.post("/tenants", json={"name": "Acme"}, headers=admin.headers)
    assert r.status_code == 201
    acme = r.json()["data"]
    assert set(acme) == {"id", "name", "createdAt", "updatedAt"}
    assert (await client.post("/tenants", json={"name": "Acme"}, headers=admin.headers)).status_code == 409
    assert (await client.post("/tenants", json={"name": ""}, headers=admin.headers)).status_code == 400
    member = await factory.user(tenant=acme["id"])
    creator = await factory.user(permissions=["iam.tenant.create"])
    reader = await factory.user(permissions=["iam.tenant.read"])
    assert (await client.post("/tenants", json={"name": "Evil"}, headers=member.headers)).status_code == 403
    r = await client.post("/tenants", json={"name": "Beta"}, headers=creator.headers)
    assert r.status_code == 201
    beta = r.json()["data"]
    assert [t["id"] for t in (await client.get("/tenants", headers=member.headers)).json()["data"]] == [
        acme["id"]
    ]
    assert (await client.get("/tenants", headers=creator.headers)).json()["data"] == []
    listed = (await client.get("/tenants", headers=reader.headers)).json()["data"]
    assert [t["id"] for t in listed] == sorted([acme["id"], beta["id"]])


async def test_roles(client: httpx.AsyncClient, admin: Account, factory: Factory) -> None:
    a = await factory.tenant()
    b = await factory.tenant()
    lead = await factory.user(tenant=a, permissions=["tenant.all"])
    member = await factory.user(tenant=a)
    other_lead = await factory.user(tenant=b, permissions=["tenant.roles.read", "tenant.roles.create"])

    r = await client.post(
        "/roles", json={"name": "global", "permissions": ["tenant.flows.read"]}, headers=admin.headers
    )
    assert r.status_code == 201
    glob = r.json()["data"]
    assert (glob["isGlobal"], glob["scope"]) == (True, None)

    r = await client.post(
        "/roles", json={"name": "ops", "permissions": ["tenant.flows.update"]}, headers=lead.headers
    )
    assert r.status_code == 201, r.text
    ops = r.json()["data"]
    assert (ops["isGlobal"], ops["scope"]) == (False, a)
    r = await client.post("/roles", json={"name": "ops", "permissions": []}, headers=lead.headers)
    assert r.status_code == 409
    r = await client.post("/roles", json={"name": "x", "permissions": ["all"]}, headers=lead.headers)
    assert r.status_code == 403
    r = await client.post("/roles", json={"name": "x", "permissions": [], "scope": b}, headers=lead.headers)
    assert r.status_code == 403
    r = await client.post("/roles", json={"name": "x", "permissions": ["bogus"]}, headers=lead.headers)
    assert r.status_code == 400
    assert (await client.post("/roles", json={"name": "x"}, headers=member.headers)).status_code == 403

    assert (await client.get("/roles", headers=member.headers)).status_code == 403
    assert [x["id"] for x in (await client.get("/roles", headers=lead.headers)).json()["data"]] == sorted(
        [glob["id"], ops["id"]]
    )
    assert [x["id"] for x in (await client.get("/roles", headers=other_lead.headers)).json()["data"]] == [
        glob["id"]
    ]
    assert (await client.get(f"/roles/{ops['id']}", headers=other_lead.headers)).status_code == 404
    assert (await client.get("/roles/nope", headers=lead.headers)).status_code == 400

    r = await client.patch(f"/roles/{ops['id']}", json={"name": "operators"}, headers=lead.headers)
    assert (r.status_code, r.json()["data"]["name"]) == (200, "operators")
    r = await client.post("/roles", json={"name": "readers", "permissions": []}, headers=lead.headers)
    assert r.status_code == 201, r.text
    readers = r.json()["data"]
    r = await client.patch(f"/roles/{readers['id']}", json={"name": "operators"}, headers=lead.headers)
    assert (r.status_code, r.json()["errors"][0]["message"]) == (
        409,
        "A role named operators already exists there.",
    ), r.text
    assert (await client.get(f"/roles/{readers['id']}", headers=lead.headers)).json()["data"][
        "name"
    ] == "readers"
    r = await client.patch(f"/roles/{ops['id']}", json={"name": "operators"}, headers=lead.headers)
    assert r.status_code == 200, "keeping its own name is no clash"
    assert (
        await client.patch(f"/roles/{glob['id']}", json={"name": "g"}, headers=lead.headers)
    ).status_code == 403
    assert (
        await client.patch(f"/roles/{ops['id']}", json={"name": "y"}, headers=other_lead.headers)
    ).status_code == 404
    assert (await client.delete(f"/roles/{glob['id']}", headers=lead.headers)).status_code == 403
    r = await client.delete(f"/roles/{ops['id']}", headers=lead.headers)
    assert (r.status_code, r.json()) == (200, {})
    assert (await client.get(f"/roles/{ops['id']}", headers=lead.headers)).status_code == 404


async def test_first_admin_gets_a_private_password_file(
    client: httpx.AsyncClient, db: Database, tmp_path: Path
) -> None:
    path = tmp_path / "initial-admin-password"
    path.write_text("stale")
    path.chmod(0o644)
    async with db.write() as session:
        name = await iam.ensure_first_admin(session, username=None, password=None, data_dir=tmp_path)
    assert name == "admin@flowyard.local"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = dict(line.split(": ", 1) for line in path.read_text().splitlines())
    r = await login(client, lines["username"], lines["password"])
    assert r.status_code == 200
    async with db.write() as session:
        assert (
            await iam.ensure_first_admin(session, username="x@y.z", password="pw", data_dir=tmp_path) is None
        )


async def test_token_cache_never_outlives_iam_changes_in_this_process(
    client: httpx.AsyncClient, factory: Factory, admin: Account
) -> None:
    account = await factory.user()
    r = await client.post("/login", json={"username": account.username, "password": account.password})
    session_token = {"Authorization": f"Bearer {r.json()['token']}"}
    assert (await client.get("/flows", headers=session_token)).status_code == 200  # now cached
    assert (await client.post("/logout", headers=session_token)).status_code == 200
    assert (await client.get("/flows", headers=session_token)).status_code == 401
    assert (await client.get("/flows", headers=account.headers)).status_code == 200  # cached API token
    r = await client.patch(f"/api/users/{account.id}", json={"status": "DISABLED"}, headers=admin.headers)
    assert r.status_code == 200
    assert (await client.get("/flows", headers=account.headers)).status_code == 401
