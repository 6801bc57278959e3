"""Bearer tokens: session tokens from /login and API tokens; resolving, narrowing,
revoking and introspecting them. No HTTP here.

Session tokens slide (each use extends them to ``session_ttl`` from now) but never
past ``session_max`` after they were issued (the absolute lifetime, computed from
``created_at``, so changing the setting applies to sessions already open).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.api.listing import id_page
from flowyard.clock import as_utc, utcnow
from flowyard.config import Settings
from flowyard.db.fast import Fetch, Row
from flowyard.db.session import Database
from flowyard.errors import Forbidden, InvalidInput, NotFound, Unauthorized
from flowyard.iam import permissions as perms
from flowyard.iam import policy
from flowyard.iam.models import Role, Token, User, UserRole
from flowyard.iam.policy import Action
from flowyard.iam.principal import Principal
from flowyard.iam.roles import combine_permissions, effective_permissions
from flowyard.ids import check_id

SESSION = "session"
API = "api"
# Sliding expiry is written back at most this often per token, not on every request.
_SLIDE_GRANULARITY = timedelta(seconds=60)


@dataclass(frozen=True)
class Lifetimes:
    """How long session tokens live: idle (sliding) and absolute, in seconds."""

    session_ttl: float
    session_max: float

    @classmethod
    def of(cls, settings: Settings) -> Lifetimes:
        return cls(settings.session_ttl_seconds, settings.session_max_seconds)

    def session_expiry(self, created_at: datetime, now: datetime) -> datetime:
        return min(
            now + timedelta(seconds=self.session_ttl), created_at + timedelta(seconds=self.session_max)
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token_text() -> str:
    return "fy_" + secrets.token_urlsafe(32)  # 256 bits


async def _issue(
    session: AsyncSession,
    user: User,
    *,
    kind: str,
    expires_at: datetime | None,
    description: str | None = None,
    permissions: list[str] | None = None,
) -> tuple[Token, str]:
    text = _new_token_text()
    token = Token(
        user_id=user.id,
        token_hash=hash_token(text),
        kind=kind,
        description=description,
        permissions=permissions,
        created_at=utcnow(),
        expires_at=expires_at,
    )
    session.add(token)
    await session.flush()
    return token, text


def _expired(token: Token | Row, now: datetime, lifetimes: Lifetimes) -> bool:
    return (deadline := _valid_until(token, lifetimes)) is not None and deadline <= now


def _valid_until(token: Token | Row, lifetimes: Lifetimes) -> datetime | None:
    """When the token stops being accepted (None: never), as of its stored expiry."""
    until = as_utc(token.expires_at) if token.expires_at is not None else None
    if token.kind == SESSION:
        absolute = as_utc(token.created_at) + timedelta(seconds=lifetimes.session_max)
        until = absolute if until is None else min(until, absolute)
    return until


async def _find(session: AsyncSession, token_text: str) -> tuple[Token, User] | None:
    row = (
        await session.execute(
            sa.select(Token, User)
            .join(User, User.id == Token.user_id)
            .where(Token.token_hash == hash_token(token_text))
        )
    ).first()
    return None if row is None else (row[0], row[1])


_t, _u, _ur, _r = Token.__table__, User.__table__, UserRole.__table__, Role.__table__
# Every request's token, user and the user's roles in one statement straight from the driver
# (db/fast.py): one row per role held (or one with no role).
_RESOLVE = Fetch(
    sa.select(
        _t.c.id,
        _t.c.kind,
        _t.c.permissions.label("token_permissions"),
        _t.c.created_at,
        _t.c.expires_at,
        _u.c.id.label("user_id"),
        _u.c.username,
        _u.c.tenant_id,
        _u.c.status,
        _u.c.permissions.label("user_permissions"),
        _r.c.permissions.label("role_permissions"),
    )
    .select_from(
        _t.join(_u, _u.c.id == _t.c.user_id)
        .outerjoin(_ur, _ur.c.user_id == _u.c.id)
        .outerjoin(_r, _r.c.id == _ur.c.role_id)
    )
    .where(_t.c.token_hash == sa.bindparam("token_hash"))
)


@dataclass(frozen=True)
class Resolved:
    """A bearer token resolved: who calls, whether a session's expiry should slide, and
    until when the token is valid (a cache must not keep it longer)."""

    principal: Principal
    slide: bool
    valid_until: datetime | None


async def authenticate(db: Database, token_text: str, lifetimes: Lifetimes) -> Resolved:
    """Resolve a bearer token (401 when unknown, expired or of a disabled account)."""
    now = utcnow()
    rows = await _RESOLVE.all(db, token_hash=hash_token(token_text))
    if not rows:
        raise Unauthorized()
    token = rows[0]
    if _expired(token, now, lifetimes):
        raise Unauthorized("Token expired.")
    if token.status == "DISABLED":
        raise Unauthorized("Account disabled.")
    slide = token.kind == SESSION and (
        token.expires_at is None
        or lifetimes.session_expiry(as_utc(token.created_at), now) - as_utc(token.expires_at)
        > _SLIDE_GRANULARITY
    )
    held = combine_permissions(token.user_permissions, (r.role_permissions for r in rows))
    granted = perms.narrow(held, token.token_permissions)
    principal = Principal(
        token.user_id,
        token.username,
        token.tenant_id,
        granted,
        token.id,
        narrowed=token.token_permissions is not None,
    )
    return Resolved(principal, slide, _valid_until(token, lifetimes))


async def slide_session(session: AsyncSession, token_id: str, lifetimes: Lifetimes) -> None:
    token = await session.get(Token, token_id)
    if token is None:
        return
    now = utcnow()
    token.expires_at = lifetimes.session_expiry(as_utc(token.created_at), now)
    token.last_used_at = now


async def open_session(session: AsyncSession, user: User, lifetimes: Lifetimes) -> tuple[Token, str]:
    """Issue a session token (after a successful password check)."""
    now = utcnow()
    return await _issue(session, user, kind=SESSION, expires_at=lifetimes.session_expiry(now, now))


async def logout(session: AsyncSession, principal: Principal) -> None:
    await session.execute(sa.delete(Token).where(Token.id == principal.token_id))


async def revoke_user_tokens(
    session: AsyncSession, user_id: str, *, keep_token_id: str | None = None, keep_api_tokens: bool = False
) -> int:
    """Revoke a user's tokens (all sessions; API tokens unless kept), except ``keep_token_id``."""
    where = [Token.user_id == user_id]
    if keep_token_id:
        where.append(Token.id != keep_token_id)
    if keep_api_tokens:
        where.append(Token.kind != API)
    result = await session.execute(sa.delete(Token).where(*where))
    return int(getattr(result, "rowcount", 0) or 0)


async def create_api_token(
    session: AsyncSession,
    principal: Principal,
    *,
    description: str | None,
    expires_at: datetime | None,
    permissions: list[str] | None,
    user_id: str | None = None,
) -> tuple[Token, str]:
    """An API token for the caller (or, for an administrator, another user)."""
    policy.require(principal, Action.TOKEN_CREATE)
    owner_id = user_id or principal.user_id
    if owner_id != principal.user_id and not policy.allowed(principal, Action.TOKEN_FOR_OTHERS):
        raise Forbidden("Only an administrator can create tokens for other users.")
    user = await session.get(User, owner_id)
    if user is None:
        raise NotFound(f"User {owner_id} not found.")
    return await issue_api_token(
        session,
        user,
        description=description,
        expires_at=expires_at,
        permissions=permissions,
        creator=principal,
    )


async def issue_api_token(
    session: AsyncSession,
    user: User,
    *,
    description: str | None,
    expires_at: datetime | None,
    permissions: list[str] | None,
    creator: Principal | None = None,
) -> tuple[Token, str]:
    """Issue an API token of ``user``; ``creator`` None is the operator (CLI, test set-up).

    Never wider than its creator's token: without ``permissions``, a token made by a
    narrowed token of the same user gets the same narrowing; listed permissions must
    be held by the user and be within what the creating token may do.
    """
    if expires_at is not None:
        # A timestamp without a zone is taken as UTC rather than failing to compare.
        expires_at = as_utc(expires_at)
        if expires_at <= utcnow():
            raise InvalidInput("expiresAt must be in the future.", field="expiresAt")
    if permissions is None and creator is not None and creator.user_id == user.id and creator.narrowed:
        permissions = sorted(creator.permissions)
    if permissions is not None:
        permissions = perms.validate(permissions)
        held = await effective_permissions(session, user)
        within = creator.can if creator is not None else (lambda _p: True)
        excess = [p for p in permissions if not (perms.implied(held, p) and within(p))]
        if excess:
            raise Forbidden(f"The token cannot have permissions beyond its creator's: {', '.join(excess)}.")
    return await _issue(
        session, user, kind=API, expires_at=expires_at, description=description, permissions=permissions
    )


async def list_tokens(
    session: AsyncSession, principal: Principal, *, limit: int, offset: int
) -> tuple[Sequence[Token], int]:
    """The caller's own tokens."""
    where = Token.user_id == principal.user_id
    return await id_page(session, Token, where, limit=limit, offset=offset)


async def delete_token(session: AsyncSession, principal: Principal, token_id: str) -> None:
    """Revoke one of one's own tokens (an administrator: anyone's)."""
    policy.require(principal, Action.TOKEN_DELETE)
    check_id(token_id, "token")
    token = await session.get(Token, token_id)
    if token is None or (token.user_id != principal.user_id and not principal.is_admin):
        raise NotFound(f"Token {token_id} not found.")
    await session.delete(token)


async def introspect(
    session: AsyncSession, principal: Principal, token_text: str, lifetimes: Lifetimes
) -> tuple[Token, User, frozenset[str]] | None:
    policy.require(principal, Action.TOKEN_INTROSPECT)
    found = await _find(session, token_text)
    if found is None:
        return None
    token, user = found
    if _expired(token, utcnow(), lifetimes):
        return None
    return token, user, perms.narrow(await effective_permissions(session, user), token.permissions)
