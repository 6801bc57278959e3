"""Webhook secrets stored sealed with the service's key (as credentials are), not in plaintext:
``flows.webhook_secret`` becomes TEXT on PostgreSQL (a sealed 200-character secret is about 360
characters; SQLite does not enforce the length) and
every stored secret is sealed in ``SecretBox``'s format (issue 17). The downgrade opens them again.

The key comes from the migration runner (``flowyard.db.migrate.upgrade(..., secret_key=...)``,
which ``flowyard migrate`` and ``serve`` pass); it is needed only when a flow has a secret.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 11:40:00.000000
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
import sqlalchemy as sa
from alembic import op
from cryptography.fernet import Fernet

# Renumbering at a merge: change ``revision`` (and the file name) and ``down_revision`` only.
revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

KEY_ATTRIBUTE = "flowyard_secret_key"

_flows = sa.table("flows", sa.column("id", sa.String), sa.column("webhook_secret", sa.Text))


class _Box:
    """``flowyard.secrets.crypto.SecretBox``'s format, written here so that the migration stays
    what it is whatever that module becomes: Fernet over the value's JSON."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    def seal(self, value: str) -> str:
        return self._fernet.encrypt(orjson.dumps(value)).decode()

    def open(self, token: str) -> str:
        return str(orjson.loads(self._fernet.decrypt(token.encode())))


def _box() -> _Box:
    config = op.get_context().config
    key = config.attributes.get(KEY_ATTRIBUTE) if config is not None else None
    if not key:
        raise RuntimeError(
            "migration 0015 seals the flows' webhook secrets and needs the service's key: "
            "run it with `flowyard migrate` (FLOWYARD_SECRET_KEY or <data_dir>/secret.key)"
        )
    return _Box(key)


def _rewrite(change: Callable[[_Box, str], str]) -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_flows.c.id, _flows.c.webhook_secret).where(_flows.c.webhook_secret.is_not(None))
    ).all()
    if not rows:
        return
    box = _box()
    for flow_id, stored in rows:
        bind.execute(
            sa.update(_flows).where(_flows.c.id == flow_id).values(webhook_secret=change(box, stored))
        )


def _retype(new: sa.types.TypeEngine[str], old: sa.types.TypeEngine[str]) -> None:
    # SQLite does not enforce a VARCHAR length, and rebuilding ``flows`` there would drop the
    # search triggers of 0008: the column keeps its declared type (the model says so too).
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("flows", "webhook_secret", type_=new, existing_type=old, existing_nullable=True)


def upgrade() -> None:
    _retype(sa.Text(), sa.String(length=200))
    _rewrite(lambda box, plain: box.seal(plain))


def downgrade() -> None:
    _rewrite(lambda box, sealed: box.open(sealed))
    _retype(sa.String(length=200), sa.Text())
