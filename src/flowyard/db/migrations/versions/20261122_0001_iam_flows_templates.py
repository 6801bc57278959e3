"""iam flows templates

Revision ID: 0001
Revises:
Create Date: 2026-11-22 04:24:15.322762
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "flows",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("name_lc", sa.String(length=200), nullable=False),
        sa.Column("description_lc", sa.Text(), nullable=True),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("owners", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("status_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_execution_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("from_template", sa.String(length=24), nullable=True),
        sa.Column("webhook_secret", sa.String(length=200), nullable=True),
        sa.Column("created_by", sa.String(length=24), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_flows")),
    )
    with op.batch_alter_table("flows", schema=None) as batch_op:
        batch_op.create_index("ix_flows_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index("ix_flows_name_id", ["name", "id"], unique=False)
        batch_op.create_index("ix_flows_next_run_at", ["next_run_at"], unique=False)
        batch_op.create_index("ix_flows_status_changed", ["status", "status_changed_at"], unique=False)
        batch_op.create_index("ix_flows_status_id", ["status", "id"], unique=False)
        batch_op.create_index("ix_flows_updated_at_id", ["updated_at", "id"], unique=False)

    op.create_table(
        "templates",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("name_lc", sa.String(length=200), nullable=False),
        sa.Column("description_lc", sa.Text(), nullable=True),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("owners", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=24), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_templates")),
    )
    with op.batch_alter_table("templates", schema=None) as batch_op:
        batch_op.create_index("ix_templates_created_at_id", ["created_at", "id"], unique=False)
        batch_op.create_index("ix_templates_name_id", ["name", "id"], unique=False)
        batch_op.create_index("ix_templates_status_id", ["status", "id"], unique=False)
        batch_op.create_index("ix_templates_updated_at_id", ["updated_at", "id"], unique=False)

    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "flow_owners",
        sa.Column("flow_id", sa.String(length=24), nullable=False),
        sa.Column("owner_type", sa.String(length=16), nullable=False),
        sa.Column("owner_id", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["flow_id"], ["flows.id"], name=op.f("fk_flow_owners_flow_id_flows"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("flow_id", "owner_type", "owner_id", name=op.f("pk_flow_owners")),
    )
    with op.batch_alter_table("flow_owners", schema=None) as batch_op:
        batch_op.create_index("ix_flow_owners_owner", ["owner_type", "owner_id", "flow_id"], unique=False)

    op.create_table(
        "roles",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("permissions", sa.JSON(), nullable=False),
        sa.Column("scope", sa.String(length=24), nullable=True),
        sa.Column("is_global", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["scope"], ["tenants.id"], name=op.f("fk_roles_scope_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_roles")),
        sa.UniqueConstraint("scope", "name", name=op.f("uq_roles_scope_name")),
    )
    with op.batch_alter_table("roles", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_roles_scope"), ["scope"], unique=False)

    op.create_table(
        "template_owners",
        sa.Column("template_id", sa.String(length=24), nullable=False),
        sa.Column("owner_type", sa.String(length=16), nullable=False),
        sa.Column("owner_id", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["template_id"],
            ["templates.id"],
            name=op.f("fk_template_owners_template_id_templates"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("template_id", "owner_type", "owner_id", name=op.f("pk_template_owners")),
    )
    with op.batch_alter_table("template_owners", schema=None) as batch_op:
        batch_op.create_index(
            "ix_template_owners_owner", ["owner_type", "owner_id", "template_id"], unique=False
        )

    op.create_table(
        "template_tags",
        sa.Column("template_id", sa.String(length=24), nullable=False),
        sa.Column("tag", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(
            ["template_id"],
            ["templates.id"],
            name=op.f("fk_template_tags_template_id_templates"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("template_id", "tag", name=op.f("pk_template_tags")),
    )
    with op.batch_alter_table("template_tags", schema=None) as batch_op:
        batch_op.create_index("ix_template_tags_tag", ["tag", "template_id"], unique=False)

    op.create_table(
        "users",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("username", sa.String(length=320), nullable=False),
        sa.Column("firstname", sa.String(length=200), nullable=False),
        sa.Column("lastname", sa.String(length=200), nullable=False),
        sa.Column("password_hash", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=24), nullable=True),
        sa.Column("permissions", sa.JSON(), nullable=False),
        sa.Column("confirmed", sa.Boolean(), nullable=False),
        sa.Column("img", sa.String(length=2000), nullable=True),
        sa.Column("failed_login_attempts", sa.Integer(), nullable=False),
        sa.Column("last_login", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_users_tenant_id_tenants"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_users_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=24), nullable=False),
        sa.Column("user_id", sa.String(length=24), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=True),
        sa.Column("permissions", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tokens_user_id"), ["user_id"], unique=False)

    op.create_table(
        "user_roles",
        sa.Column("user_id", sa.String(length=24), nullable=False),
        sa.Column("role_id", sa.String(length=24), nullable=False),
        sa.ForeignKeyConstraint(
            ["role_id"], ["roles.id"], name=op.f("fk_user_roles_role_id_roles"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_user_roles_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", "role_id", name=op.f("pk_user_roles")),
    )
    with op.batch_alter_table("user_roles", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_user_roles_role_id"), ["role_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("user_roles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_user_roles_role_id"))

    op.drop_table("user_roles")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tokens_user_id"))

    op.drop_table("tokens")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_users_tenant_id"))

    op.drop_table("users")
    with op.batch_alter_table("template_tags", schema=None) as batch_op:
        batch_op.drop_index("ix_template_tags_tag")

    op.drop_table("template_tags")
    with op.batch_alter_table("template_owners", schema=None) as batch_op:
        batch_op.drop_index("ix_template_owners_owner")

    op.drop_table("template_owners")
    with op.batch_alter_table("roles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_roles_scope"))

    op.drop_table("roles")
    with op.batch_alter_table("flow_owners", schema=None) as batch_op:
        batch_op.drop_index("ix_flow_owners_owner")

    op.drop_table("flow_owners")
    op.drop_table("tenants")
    with op.batch_alter_table("templates", schema=None) as batch_op:
        batch_op.drop_index("ix_templates_updated_at_id")
        batch_op.drop_index("ix_templates_status_id")
        batch_op.drop_index("ix_templates_name_id")
        batch_op.drop_index("ix_templates_created_at_id")

    op.drop_table("templates")
    with op.batch_alter_table("flows", schema=None) as batch_op:
        batch_op.drop_index("ix_flows_updated_at_id")
        batch_op.drop_index("ix_flows_status_id")
        batch_op.drop_index("ix_flows_status_changed")
        batch_op.drop_index("ix_flows_next_run_at")
        batch_op.drop_index("ix_flows_name_id")
        batch_op.drop_index("ix_flows_created_at_id")

    op.drop_table("flows")
