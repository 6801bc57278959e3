"""Each escalation of issue 7 (items 1-3), written as the attack: it fails, nothing
changed, and the legitimate path next to it still works. SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.db.session import Database
from flowyard.iam.models import Token
from tests.conftest import Account, Factory


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def login(client: httpx.AsyncClient, username: str, password: str) -> httpx.Response:
    return await client.post("/login", json={"username": username, "password": password})


async def make_role(
    client: httpx.AsyncClient, admin: Account, name: str, permissions: list[str], scope: str
) -> str:
    r = await client.post(
        "/roles", json={"name": name, "permissions": permissions, "scope": scope}, headers=admin.headers
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


async def user_as_admin(client: httpx.AsyncClient, admin: Account, user_id: str) -> dict[str, Any]:
    r = await client.get(f"/api/users/{user_id}", headers=admin.headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


# -- 1. roles bypassed the grant check ------------------------------------------------------


async def test_account_creator_cannot_grant_a_role_with_tenant_all(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    tenant = await factory.tenant()
    creator = await factory.user(tenant=tenant, permissions=["iam.account.create", "tenant.flows.read"])
    boss = await make_role(client, admin, "boss", ["tenant.all"], tenant)
    viewers = await make_role(client, admin, "viewers", ["tenant.flows.read"], tenant)

    new = {"username": "mallory@example.com", "password": "long enough pw", "roles": [boss]}
    r = await client.post("/api/users", json=new, headers=creator.headers)
    assert r.status_code == 403, r.text
    assert "tenant.all" in r.json()["errors"][0]["message"]
    # Mixed with a grantable role it is still refused.
    r = await client.post("/api/users", json={**new, "roles": [viewers, boss]}, headers=creator.headers)
    assert r.status_code == 403
    r = await client.get("/api/users?username=mallory@example.com", headers=admin.headers)
    assert r.json() == []

    # The legitimate path: a role whose permissions the creator holds.
    r = await client.post("/api/users", json={**new, "roles": [viewers]}, headers=creator.headers)
    assert r.status_code == 201, r.text
    assert [ro["id"] for ro in r.json()["roles"]] == [viewers]


async def test_account_updater_cannot_give_itself_roles(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    tenant = await factory.tenant()
    updater = await factory.user(tenant=tenant, permissions=["iam.account.update"])
    boss = await make_role(client, admin, "boss", ["tenant.all"], tenant)
    same = await make_role(client, admin, "updaters", ["iam.account.update"], tenant)

    r = await client.patch(f"/api/users/{updater.id}", json={"roles": [boss]}, headers=updater.headers)
    assert r.status_code == 403, r.text
    assert (await user_as_admin(client, admin, updater.id))["roles"] == []
    assert (await client.get("/roles", headers=updater.headers)).status_code == 403
    r = await client.patch(
        f"/api/users/{updater.id}", json={"permissions": ["tenant.roles.read"]}, headers=updater.headers
    )
    assert r.status_code == 403
    assert (await user_as_admin(client, admin, updater.id))["permissions"] == ["iam.account.update"]

    # Nor to someone else of its tenant.
    member = await factory.user(tenant=tenant)
    r = await client.patch(f"/api/users/{member.id}", json={"roles": [boss]}, headers=updater.headers)
    assert r.status_code == 403
    assert (await user_as_admin(client, admin, member.id))["roles"] == []

    # Legitimate: a role within its own permissions, to itself and to others.
    r = await client.patch(f"/api/users/{updater.id}", json={"roles": [same]}, headers=updater.headers)
    assert r.status_code == 200, r.text
    assert [ro["id"] for ro in r.json()["roles"]] == [same]
    r = await client.patch(f"/api/users/{member.id}", json={"roles": [same]}, headers=updater.headers)
    assert r.status_code == 200


async def test_changing_ones_own_roles_needs_account_update(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    tenant = await factory.tenant()
    member = await factory.user(tenant=tenant)  # holds tenant.flows.* among the defaults
    flows = await make_role(client, admin, "flows", ["tenant.flows.read"], tenant)
    r = await client.patch(f"/api/users/{member.id}", json={"roles": [flows]}, headers=member.headers)
    assert r.status_code == 403
    assert "iam.account.update" in r.json()["errors"][0]["message"]
    r = await client.patch(f"/api/users/{member.id}", json={"roles": []}, headers=member.headers)
    assert r.status_code == 403
    assert (await user_as_admin(client, admin, member.id))["roles"] == []
    r = await client.patch(f"/api/users/{member.id}", json={"roles": [flows]}, headers=admin.headers)
    assert r.status_code == 200


async def test_role_editor_cannot_widen_a_role(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    tenant = await factory.tenant()
    editor = await factory.user(tenant=tenant, permissions=["tenant.roles.read", "tenant.roles.update"])
    mine = await make_role(client, admin, "mine", ["tenant.roles.read"], tenant)
    r = await client.patch(
        f"/roles/{mine}", json={"permissions": ["tenant.roles.read", "tenant.all"]}, headers=editor.headers
    )
    assert r.status_code == 403
    r = await client.get(f"/roles/{mine}", headers=admin.headers)
    assert r.json()["data"]["permissions"] == ["tenant.roles.read"]
    r = await client.patch(
        f"/roles/{mine}",
        json={"permissions": ["tenant.roles.read", "tenant.roles.update"]},
        headers=editor.headers,
    )
    assert r.status_code == 200
    # Dropping a permission it lacks is not a grant.
    boss = await make_role(client, admin, "boss", ["tenant.all", "tenant.roles.read"], tenant)
    r = await client.patch(
        f"/roles/{boss}", json={"permissions": ["tenant.roles.read"]}, headers=editor.headers
    )
    assert (r.status_code, r.json()["data"]["permissions"]) == (200, ["tenant.roles.read"])


# -- 2. a tenantless non-admin took over the administrator ---------------------------------


async def test_tenantless_user_cannot_take_over_the_admin(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    attacker = await factory.user(
        permissions=["iam.account.read", "iam.account.update", "iam.account.delete", "iam.account.create"]
    )
    other_loner = await factory.user()
    before = await user_as_admin(client, admin, admin.id)

    for body in (
        {"password": "owned by mallory"},
        {"password": "owned by mallory", "currentPassword": "guess guess"},
        {"firstname": "Mallory"},
        {"status": "DISABLED"},
    ):
        r = await client.patch(f"/api/users/{admin.id}", json=body, headers=attacker.headers)
        assert r.status_code == 403, (body, r.text)
    r = await client.patch(f"/api/users/{other_loner.id}", json={"firstname": "x"}, headers=attacker.headers)
    assert r.status_code == 403
    assert (await client.delete(f"/api/users/{admin.id}", headers=attacker.headers)).status_code == 403
    new = {"username": "sock@example.com", "password": "long enough pw"}
    assert (await client.post("/api/users", json=new, headers=attacker.headers)).status_code == 403

    assert await user_as_admin(client, admin, admin.id) == before
    assert (await login(client, admin.username, "owned by mallory")).status_code == 401
    assert (await login(client, admin.username, admin.password)).status_code == 200
    assert (await client.get("/api/users", headers=admin.headers)).status_code == 200

    # Legitimate: it may still read everyone and manage itself.
    assert (await client.get(f"/api/users/{admin.id}", headers=attacker.headers)).status_code == 200
    r = await client.patch(f"/api/users/{attacker.id}", json={"firstname": "Me"}, headers=attacker.headers)
    assert (r.status_code, r.json()["firstname"]) == (200, "Me")


async def test_tenant_manager_cannot_demote_an_administrator_of_its_tenant(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    tenant = await factory.tenant()
    local_admin = await factory.user(tenant=tenant, permissions=["all"])
    manager = await factory.user(tenant=tenant, permissions=["iam.account.update", "iam.account.delete"])
    member = await factory.user(tenant=tenant)
    before = await user_as_admin(client, admin, local_admin.id)
    for body in ({"permissions": []}, {"status": "DISABLED"}, {"firstname": "x"}):
        r = await client.patch(f"/api/users/{local_admin.id}", json=body, headers=manager.headers)
        assert r.status_code == 403, (body, r.text)
    assert (await client.delete(f"/api/users/{local_admin.id}", headers=manager.headers)).status_code == 403
    assert await user_as_admin(client, admin, local_admin.id) == before
    assert (await client.get("/tenants", headers=local_admin.headers)).status_code == 200
    # Legitimate: the manager manages the members of its tenant.
    r = await client.patch(f"/api/users/{member.id}", json={"status": "PENDING"}, headers=manager.headers)
    assert (r.status_code, r.json()["status"]) == (200, "PENDING")


# -- 3. narrowed tokens widened themselves ---------------------------------------------------


async def test_narrowed_token_cannot_mint_an_unrestricted_token(
    client: httpx.AsyncClient, factory: Factory
) -> None:
    tenant = await factory.tenant()
    user = await factory.user(tenant=tenant)  # holds tenant.flows.read and iam.token.create
    r = await client.post("/tokens", json={"permissions": ["iam.token.create"]}, headers=user.headers)
    assert r.status_code == 201
    narrow = r.json()["data"]["token"]
    assert (await client.get("/flows", headers=bearer(narrow))).status_code == 403

    r = await client.post("/tokens", json={}, headers=bearer(narrow))
    assert r.status_code == 201, r.text
    minted = r.json()["data"]
    assert minted["permissions"] == ["iam.token.create"]
    assert (await client.get("/flows", headers=bearer(minted["token"]))).status_code == 403
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=bearer(narrow))
    assert r.status_code == 403
    assert "tenant.flows.read" in r.json()["errors"][0]["message"]

    # Legitimate: the unrestricted token makes unrestricted tokens.
    r = await client.post("/tokens", json={}, headers=user.headers)
    assert r.status_code == 201
    assert r.json()["data"]["permissions"] is None
    assert (await client.get("/flows", headers=bearer(r.json()["data"]["token"]))).status_code == 200


async def test_narrowed_token_cannot_change_the_password_without_the_current_one(
    client: httpx.AsyncClient, factory: Factory, admin: Account
) -> None:
    tenant = await factory.tenant()
    user = await factory.user(tenant=tenant)
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=user.headers)
    narrow = bearer(r.json()["data"]["token"])
    session = bearer((await login(client, user.username, user.password)).json()["token"])
    assert (await client.get("/flows", headers=session)).status_code == 200

    r = await client.patch(f"/api/users/{user.id}", json={"password": "stolen password"}, headers=narrow)
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "currentPassword"
    r = await client.patch(
        f"/api/users/{user.id}",
        json={"password": "stolen password", "currentPassword": "not it at all"},
        headers=narrow,
    )
    assert r.status_code == 403
    assert (await login(client, user.username, "stolen password")).status_code == 401
    assert (await client.get("/flows", headers=session)).status_code == 200

    # An administrator changing its own password needs the current one too.
    r = await client.patch(f"/api/users/{admin.id}", json={"password": "new admin pw"}, headers=admin.headers)
    assert r.status_code == 400

    # Legitimate: with the current password; the other sessions and tokens end.
    r = await client.patch(
        f"/api/users/{user.id}",
        json={"password": "a new password", "currentPassword": user.password},
        headers=narrow,
    )
    assert r.status_code == 200, r.text
    assert (await client.get("/flows", headers=narrow)).status_code == 200  # the caller's own token
    assert (await client.get("/flows", headers=session)).status_code == 401
    assert (await client.get("/flows", headers=user.headers)).status_code == 401
    assert (await login(client, user.username, "a new password")).status_code == 200


async def test_password_change_revokes_other_sessions_and_tokens(
    client: httpx.AsyncClient, factory: Factory, admin: Account, db: Database
) -> None:
    user = await factory.user()
    first = bearer((await login(client, user.username, user.password)).json()["token"])
    second = bearer((await login(client, user.username, user.password)).json()["token"])
    for headers in (first, second, user.headers):  # each now in the process's principal cache
        assert (await client.get("/tokens", headers=headers)).status_code == 200

    r = await client.patch(
        f"/api/users/{user.id}",
        json={"password": "changed password", "currentPassword": user.password, "keepApiTokens": True},
        headers=first,
    )
    assert r.status_code == 200, r.text
    assert (await client.get("/tokens", headers=first)).status_code == 200
    assert (await client.get("/tokens", headers=second)).status_code == 401
    assert (await client.get("/tokens", headers=user.headers)).status_code == 200  # kept on request
    assert (await login(client, user.username, user.password)).status_code == 401

    # An administrator resets another's password without the current one: every token ends.
    r = await client.patch(
        f"/api/users/{user.id}", json={"password": "reset by admin"}, headers=admin.headers
    )
    assert r.status_code == 200, r.text
    for headers in (first, user.headers):
        assert (await client.get("/tokens", headers=headers)).status_code == 401
    async with db.read() as session:
        left = await session.scalar(
            sa.select(sa.func.count()).select_from(Token).where(Token.user_id == user.id)
        )
    assert left == 0
    assert (await login(client, user.username, "reset by admin")).status_code == 200


# -- sessions: the absolute lifetime -----------------------------------------------------------


async def test_sessions_end_at_their_absolute_lifetime(
    client: httpx.AsyncClient, factory: Factory, db: Database
) -> None:
    user = await factory.user()
    ended = (await login(client, user.username, user.password)).json()
    sliding = (await login(client, user.username, user.password)).json()
    max_age = timedelta(hours=24)  # FLOWYARD_SESSION_MAX_SECONDS default
    now = utcnow()
    async with db.write() as session:
        # Used a second ago and sliding, but logged in a day ago.
        await session.execute(
            sa.update(Token)
            .where(Token.id == ended["id"])
            .values(created_at=now - max_age - timedelta(seconds=1), expires_at=now + timedelta(hours=1))
        )
        # Ten minutes of absolute lifetime left, thirty seconds of idle lifetime.
        await session.execute(
            sa.update(Token)
            .where(Token.id == sliding["id"])
            .values(created_at=now - max_age + timedelta(minutes=10), expires_at=now + timedelta(seconds=30))
        )
    r = await client.get("/tokens", headers=bearer(ended["token"]))
    assert r.status_code == 401
    assert r.json()["errors"][0]["message"] == "Token expired."
    assert (await client.get("/tokens", headers=bearer(sliding["token"]))).status_code == 200
    async with db.read() as session:
        token = await session.get(Token, sliding["id"])
        assert token is not None and token.expires_at is not None
        # It slid, but only up to the absolute end, not the idle hour from now.
        assert now + timedelta(minutes=5) < token.expires_at <= token.created_at + max_age
    # API tokens have no absolute lifetime.
    async with db.write() as session:
        await session.execute(
            sa.update(Token)
            .where(Token.user_id == user.id, Token.kind == "api")
            .values(created_at=now - 2 * max_age)
        )
    assert (await client.get("/tokens", headers=user.headers)).status_code == 200


async def test_a_token_is_no_unthrottled_oracle_for_the_current_password(
    client: httpx.AsyncClient, factory: Factory
) -> None:
    user = await factory.user()
    r = await client.post("/tokens", json={"permissions": ["tenant.flows.read"]}, headers=user.headers)
    leaked = bearer(r.json()["data"]["token"])
    for i in range(5):  # FLOWYARD_LOGIN_MAX_FAILURES default
        body = {"password": "attacker's choice", "currentPassword": f"guess {i}"}
        r = await client.patch(f"/api/users/{user.id}", json=body, headers=leaked)
        assert r.status_code == 403, r.text
    body = {"password": "attacker's choice", "currentPassword": user.password}
    r = await client.patch(f"/api/users/{user.id}", json=body, headers=leaked)
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    # Logins of that username are held back alike; the password is unchanged.
    assert (await login(client, user.username, user.password)).status_code == 429
    assert (await client.get("/flows", headers=user.headers)).status_code == 200
