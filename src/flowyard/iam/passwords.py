"""Password hashing (argon2id). No policy here: who may set a password is ``policy``'s."""

from __future__ import annotations

import asyncio
import functools
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()  # argon2id with the library's current recommended cost


@functools.cache
def _dummy_hash() -> str:
    """Verified against when there is no hash (unknown user), so both failures take as long.
    Made on first use, not at import: every process imports this module (the supervisor and the
    engine too), and a hash costs tens of ms of CPU at start, when a restart needs it most."""
    return _hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _dummy_hash(), password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


async def verify_off_loop(password_hash: str | None, password: str) -> bool:
    """Verify in a thread (argon2 takes tens of ms); a missing hash costs the same."""
    return await asyncio.to_thread(verify_password, password_hash, password)


async def hash_off_loop(password: str) -> str:
    return await asyncio.to_thread(hash_password, password)
