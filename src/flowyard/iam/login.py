"""Password login with throttling per username and per client address. No HTTP here.

The throttle lives in the database (``login_throttle``), so every API process of a
deployment counts the same attempts. Each attempt takes a slot *before* the
password is checked (one committed upsert), so concurrent guesses cannot overshoot
the limit; a success gives its slot back (the username's count is cleared, the
address's decremented), so only failures accumulate. When a username's or an
address's count passes its limit, attempts get ``429`` with ``Retry-After`` until
its window ends, whether or not the password is right.

Unknown usernames are counted and throttled exactly like known ones (the key is the
typed name, never the user row), throttled attempts skip the password check for
both alike, and a wrong password and an unknown user give the same ``401``.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.clock import utcnow
from flowyard.config import Settings
from flowyard.db.base import UTCDateTime
from flowyard.db.dialect import dialect_name
from flowyard.db.session import Database
from flowyard.errors import TooManyRequests, Unauthorized
from flowyard.iam.models import LoginThrottle, Token, User
from flowyard.iam.passwords import verify_off_loop
from flowyard.iam.tokens import Lifetimes, open_session

BAD_LOGIN = "Wrong username or password."
_THROTTLED = "Too many failed logins; try again in {seconds} seconds."
# One attempt in this many also deletes rows whose window has ended.
_CLEANUP_ONE_IN = 50


@dataclass(frozen=True)
class Limits:
    per_username: int  # 0: no limit
    per_address: int  # 0: no limit
    window_seconds: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            settings.login_max_failures,
            settings.login_max_failures_per_address,
            settings.login_window_seconds,
        )


def _key(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}:{value}".encode()).hexdigest()


def normalize_username(username: str) -> str:
    return username.strip().lower()


async def _take_slot(
    session: AsyncSession, key: str, now: datetime, window: timedelta
) -> tuple[int, datetime]:
    """Count one attempt for ``key`` (an ended window starts over); returns (attempts, window start)."""
    table = LoginThrottle.__table__
    module = postgresql if dialect_name(session) == "postgresql" else sqlite
    stmt = module.insert(table).values(key=key, attempts=1, window_start=now)
    expired = table.c.window_start <= now - window
    stmt = stmt.on_conflict_do_update(
        index_elements=["key"],
        set_={
            "attempts": sa.case((expired, 1), else_=table.c.attempts + 1),
            "window_start": sa.case((expired, sa.literal(now, UTCDateTime())), else_=table.c.window_start),
        },
    ).returning(table.c.attempts, table.c.window_start)
    row = (await session.execute(stmt)).one()
    start = row.window_start
    if isinstance(start, datetime) and start.tzinfo is None:  # the RETURNING of a raw upsert on SQLite
        start = UTCDateTime().process_result_value(start, session.get_bind().dialect) or now
    return int(row.attempts), start


async def enter(session: AsyncSession, username: str, address: str | None, limits: Limits) -> int | None:
    """Take a slot for this attempt; the seconds to wait when it is over a limit, else None."""
    now = utcnow()
    window = timedelta(seconds=limits.window_seconds)
    checks = [(_key("user", username), limits.per_username)]
    if address:
        checks.append((_key("addr", address), limits.per_address))
    wait: float | None = None
    for key, limit in sorted(checks):  # one lock order for concurrent writers
        if limit <= 0:
            continue
        attempts, start = await _take_slot(session, key, now, window)
        if attempts > limit:
            left = (start + window - now).total_seconds()
            wait = max(wait or 0.0, left)
    if random.randrange(_CLEANUP_ONE_IN) == 0:
        await session.execute(sa.delete(LoginThrottle).where(LoginThrottle.window_start <= now - window))
    return None if wait is None else max(1, math.ceil(wait))


async def succeeded(session: AsyncSession, username: str, address: str | None) -> None:
    """A right password: the username starts afresh, the address gets its slot back."""
    await session.execute(sa.delete(LoginThrottle).where(LoginThrottle.key == _key("user", username)))
    if address:
        await session.execute(
            sa.update(LoginThrottle)
            .where(LoginThrottle.key == _key("addr", address), LoginThrottle.attempts > 0)
            .values(attempts=LoginThrottle.attempts - 1)
        )


async def login(
    db: Database, username: str, password: str, *, address: str | None, limits: Limits, lifetimes: Lifetimes
) -> tuple[Token, str]:
    """Check a password and open a session: 429 when throttled, 401 (one message) when wrong."""
    name = normalize_username(username)
    async with db.write() as session:
        wait = await enter(session, name, address, limits)
    if wait is not None:
        raise TooManyRequests(_THROTTLED.format(seconds=wait), retry_after=wait)
    async with db.read() as session:
        user = await session.scalar(sa.select(User).where(User.username == name))
    ok = await verify_off_loop(user.password_hash if user else None, password)
    if user is None or not ok or user.status == "DISABLED":
        # No write here: a known and an unknown username fail along the same path.
        raise Unauthorized(BAD_LOGIN)
    async with db.write() as session:
        await succeeded(session, name, address)
        fresh = await session.get(User, user.id)
        if fresh is None or fresh.status == "DISABLED":
            raise Unauthorized(BAD_LOGIN)
        fresh.last_login = utcnow()
        return await open_session(session, fresh, lifetimes)


async def check_current_password(db: Database, user: User, password: str, *, limits: Limits) -> bool:
    """Verify a user's current password (to change it), throttled under its username like a login.

    Without this, a token of the user (say, a leaked narrowed one) would be an unthrottled
    oracle for the password.
    """
    name = normalize_username(user.username)
    async with db.write() as session:
        wait = await enter(session, name, None, limits)
    if wait is not None:
        raise TooManyRequests(_THROTTLED.format(seconds=wait), retry_after=wait)
    ok = await verify_off_loop(user.password_hash, password)
    if ok:
        async with db.write() as session:
            await succeeded(session, name, None)
    return ok
