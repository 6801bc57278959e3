"""Migration 0015: the flows' webhook secrets, stored in plaintext before, are sealed with the
service's key (SecretBox, as credentials are); the downgrade opens them again; a database that
holds secrets is not migrated without the key."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from flowyard.db import migrate
from flowyard.secrets.crypto import SecretBox
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

SECRETS = {"a" * 24: "plain-secret-0001", "b" * 24: "x" * 200, "c" * 24: None}


def _insert(url: str) -> None:
    sqlite = url.startswith("sqlite")
    now = "'2026-01-02 03:04:05'" if sqlite else "CAST('2026-01-02 03:04:05+00' AS timestamptz)"
    empty = "'[]'" if sqlite else "CAST('[]' AS json)"

    def insert(conn: sa.Connection) -> None:
        for fid, secret in SECRETS.items():
            conn.execute(
                sa.text(
                    "INSERT INTO flows (id, name, name_lc, type, graph, owners, status, status_changed_at,"
                    " version, webhook_secret, created_at, updated_at)"
                    f" VALUES (:id, 'f', 'f', 'ordinary', {empty}, {empty}, 'inactive', {now}, 1, :s,"
                    f" {now}, {now})"
                ),
                {"id": fid, "s": secret},
            )
        conn.commit()

    _in_sync(url, insert)


def _stored(url: str) -> dict[str, str | None]:
    def read(conn: sa.Connection) -> dict[str, str | None]:
        return dict(conn.execute(sa.text("SELECT id, webhook_secret FROM flows")).all())  # type: ignore[arg-type]

    return _in_sync(url, read)


def test_plaintext_secrets_are_sealed_and_opened_again(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0014")
    _insert(empty_url)
    key = Fernet.generate_key()
    with pytest.raises(RuntimeError, match="needs the service's key"):
        migrate.upgrade(empty_url, "0015")
    assert _stored(empty_url) == SECRETS  # nothing half done
    migrate.upgrade(empty_url, "0015", secret_key=key)
    stored = _stored(empty_url)
    box = SecretBox(key)
    for fid, secret in SECRETS.items():
        if secret is None:
            assert stored[fid] is None
            continue
        sealed = stored[fid]
        assert sealed is not None and secret not in sealed
        assert box.open(sealed) == secret
    migrate.downgrade(empty_url, "0014", secret_key=key)
    assert _stored(empty_url) == SECRETS


def test_without_secrets_no_key_is_needed(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0014")
    migrate.upgrade(empty_url)
