"""Stored credentials, encrypted at rest."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, Timestamped
from flowyard.ids import new_id


class Secret(Timestamped, Base):
    __tablename__ = "secrets"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    tenant: Mapped[str | None] = mapped_column(sa.String(64), index=True)
    owner_user: Mapped[str] = mapped_column(Id, nullable=False, index=True)
    # Fernet token (AES-128-CBC + HMAC-SHA256) of the JSON value.
    value: Mapped[str] = mapped_column(sa.Text, nullable=False)
