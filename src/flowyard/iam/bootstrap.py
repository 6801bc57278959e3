"""First start: the first administrator. No HTTP here."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.iam import permissions as perms
from flowyard.iam.models import User
from flowyard.iam.users import create_user

log = logging.getLogger(__name__)

PASSWORD_FILE = "initial-admin-password"


def _write_password_file(data_dir: Path, username: str, password: str) -> Path:
    """``<data_dir>/initial-admin-password``, mode 0600: a ``username: …`` and a ``password: …`` line."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / PASSWORD_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # An older file keeps its mode on O_CREAT; narrow it before the secret is written.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"username: {username}\npassword: {password}\n")
    return path


async def ensure_first_admin(
    session: AsyncSession, *, username: str | None, password: str | None, data_dir: Path
) -> str | None:
    """Create the first administrator when no user exists. Returns its username."""
    if await session.scalar(sa.select(sa.func.count()).select_from(User)):
        return None
    username = (username or "admin@flowyard.local").strip().lower()
    if not password:
        password = secrets.token_urlsafe(18)
        path = await asyncio.to_thread(_write_password_file, data_dir, username, password)
        log.warning("created administrator %s; its generated password is in %s", username, path)
    else:
        log.info("created administrator %s from FLOWYARD_ADMIN_USERNAME/PASSWORD", username)
    await create_user(
        session, username=username, password=password, firstname="Admin", lastname="", permissions=[perms.ALL]
    )
    return username
