"""Flow templates. Owners and tags are mirrored into side tables so visibility
and the ``tags`` filter are indexed joins."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from flowyard.db.base import Base, Id, Json, Timestamped
from flowyard.ids import new_id

# The FTS5 table (SQLite) holding ``(name_lc, description_lc)`` of every template for ``search``,
# its rowid the template's search key (``<name>_keys``: id's second x 2^31 + rank, so key order is
# id order second by second); written only by the triggers of migration 0023 (any write to
# ``templates`` keeps both in step), read by ``api.listing``. Not in the metadata: see
# ``flowyard.models``.
SEARCH_TABLE = "templates_search"


class Template(Timestamped, Base):
    __tablename__ = "templates"

    id: Mapped[str] = mapped_column(Id, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    description: Mapped[str | None] = mapped_column(sa.Text)
    name_lc: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    description_lc: Mapped[str | None] = mapped_column(sa.Text)
    type: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    cron: Mapped[str | None] = mapped_column(sa.String(200))
    graph: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False)
    owners: Mapped[list[dict[str, str]]] = mapped_column(Json, nullable=False, default=list)
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False, default="draft")
    tags: Mapped[list[str]] = mapped_column(Json, nullable=False, default=list)
    # A catalog template every holder of flowTemplates.read sees (SPEC §4); otherwise only its
    # owners (and administrators) do.
    shared: Mapped[bool] = mapped_column(sa.Boolean, nullable=False, default=False, server_default=sa.false())
    created_by: Mapped[str | None] = mapped_column(Id)

    __table_args__ = (
        sa.Index("ix_templates_status_id", "status", "id"),
        sa.Index("ix_templates_updated_at_id", "updated_at", "id"),
        sa.Index("ix_templates_created_at_id", "created_at", "id"),
        sa.Index("ix_templates_name_id", "name", "id"),
    )


class TemplateOwner(Base):
    __tablename__ = "template_owners"

    template_id: Mapped[str] = mapped_column(
        Id, sa.ForeignKey("templates.id", ondelete="CASCADE"), primary_key=True
    )
    owner_type: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    owner_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)

    __table_args__ = (sa.Index("ix_template_owners_owner", "owner_type", "owner_id", "template_id"),)


class TemplateTag(Base):
    __tablename__ = "template_tags"

    template_id: Mapped[str] = mapped_column(
        Id, sa.ForeignKey("templates.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(sa.String(100), primary_key=True)

    __table_args__ = (sa.Index("ix_template_tags_tag", "tag", "template_id"),)
