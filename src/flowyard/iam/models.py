"""IAM tables: tenants, roles, users and their tokens."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, Json, Timestamped, UTCDateTime
from flowyard.ids import new_id


class Tenant(Timestamped, Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(sa.String(200), nullable=False, unique=True)


class Role(Timestamped, Base):
    __tablename__ = "roles"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    description: Mapped[str | None] = mapped_column(sa.Text)
    permissions: Mapped[list[str]] = mapped_column(Json, nullable=False, default=list)
    # The tenant a tenant role belongs to; NULL for a global role (is_global).
    scope: Mapped[str | None] = mapped_column(Id, sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    is_global: Mapped[bool] = mapped_column(sa.Boolean, nullable=False, default=False)

    __table_args__ = (sa.UniqueConstraint("scope", "name"),)


class User(Timestamped, Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    username: Mapped[str] = mapped_column(sa.String(320), nullable=False, unique=True)
    firstname: Mapped[str] = mapped_column(sa.String(200), nullable=False, default="")
    lastname: Mapped[str] = mapped_column(sa.String(200), nullable=False, default="")
    password_hash: Mapped[str | None] = mapped_column(sa.String(200))
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False, default="ACTIVE")
    tenant_id: Mapped[str | None] = mapped_column(
        Id, sa.ForeignKey("tenants.id", ondelete="SET NULL"), index=True
    )
    permissions: Mapped[list[str]] = mapped_column(Json, nullable=False, default=list)
    confirmed: Mapped[bool] = mapped_column(sa.Boolean, nullable=False, default=False)
    img: Mapped[str | None] = mapped_column(sa.String(2000))
    last_login: Mapped[datetime | None] = mapped_column(UTCDateTime())


class UserRole(Base):
    __tablename__ = "user_roles"

    user_id: Mapped[str] = mapped_column(Id, sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    role_id: Mapped[str] = mapped_column(
        Id, sa.ForeignKey("roles.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    user_id: Mapped[str] = mapped_column(
        Id, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True
    )
    # SHA-256 of the token text; the text itself is shown once and never stored.
    token_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False, unique=True)
    kind: Mapped[str] = mapped_column(sa.String(16), nullable=False)  # "session" | "api"
    description: Mapped[str | None] = mapped_column(sa.String(500))
    # NULL: all of the user's permissions; otherwise narrowed to these.
    permissions: Mapped[list[str] | None] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class LoginThrottle(Base):
    """Login attempts per username and per client address, shared by every API process.

    ``key`` is the SHA-256 of ``user:<username>`` or ``addr:<address>`` (typed usernames
    are not stored in clear: people type passwords into the username field). A row
    counts the attempts of a fixed window that began at ``window_start``.
    """

    __tablename__ = "login_throttle"

    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    attempts: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, index=True)
