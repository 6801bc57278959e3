"""`flowyard backup` / `flowyard restore` on real SQLite files: what a backup holds and its file
modes, and every way a restore must refuse (an open database, a half or damaged backup, one from
a newer schema, PostgreSQL) without touching the database it would replace."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.ops import OpsError
from flowyard.ops import backup as ops


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A migrated data directory with a key file and a row to recognise it by."""
    data = tmp_path / "data"
    data.mkdir()
    migrate.upgrade(f"sqlite+aiosqlite:///{data / 'flowyard.db'}")
    conn = sqlite3.connect(data / "flowyard.db")
    conn.execute(
        "INSERT INTO tenants (id, name, created_at, updated_at) "
        "VALUES ('a' || lower(hex(randomblob(11))), 'original', '2026-01-01', '2026-01-01')"
    )
    conn.commit()
    conn.close()
    (data / "secret.key").write_bytes(Fernet.generate_key())
    return data


def _settings(data: Path, **kw: object) -> Settings:
    return Settings(data_dir=data, **kw)  # type: ignore[arg-type]


def test_backup_holds_database_key_and_manifest_private(data: Path, tmp_path: Path) -> None:
    old = os.umask(0)  # a careless umask must not make the copy of the key readable
    try:
        made = ops.backup(_settings(data), tmp_path / "b")
    finally:
        os.umask(old)
    b = tmp_path / "b"
    assert sorted(p.name for p in b.iterdir()) == ["flowyard.db", "manifest.json", "secret.key"]
    assert b.stat().st_mode & 0o777 == 0o700
    for p in b.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest == made.manifest
    assert manifest["revision"] == migrate.script_head()
    assert manifest["secretKeySource"] == "file"
    assert manifest["database"]["sha256"] == _sha(b / "flowyard.db")
    assert (b / "secret.key").read_bytes() == (data / "secret.key").read_bytes()
    # One self-contained file: no WAL to carry along.
    assert _rows(b / "flowyard.db", "PRAGMA journal_mode") == [("delete",)]
    assert _rows(b / "flowyard.db", "SELECT name FROM tenants") == [("original",)]
    # Never into something that exists with content.
    with pytest.raises(OpsError, match="not an empty directory"):
        ops.backup(_settings(data), b)


def test_key_from_the_environment_is_not_copied(data: Path, tmp_path: Path) -> None:
    made = ops.backup(_settings(data, secret_key=Fernet.generate_key().decode()), tmp_path / "b")
    assert made.manifest["secretKeySource"] == "environment" and made.manifest["secretKey"] is None
    assert not (tmp_path / "b" / "secret.key").exists()
    assert any("FLOWYARD_SECRET_KEY" in n for n in made.notes)
    # Set but empty is unset, for the service as for the backup: the key file is the key.
    made = ops.backup(_settings(data, secret_key=""), tmp_path / "b2")
    assert made.manifest["secretKeySource"] == "file"
    assert (tmp_path / "b2" / "secret.key").read_bytes() == (data / "secret.key").read_bytes()


def test_restore_replaces_and_keeps_the_replaced_files(data: Path, tmp_path: Path) -> None:
    ops.backup(_settings(data), tmp_path / "b")
    conn = sqlite3.connect(data / "flowyard.db")
    conn.execute("UPDATE tenants SET name = 'changed after the backup'")
    conn.commit()
    conn.close()
    before = _sha(data / "flowyard.db")
    old_key = (data / "secret.key").read_bytes()
    (data / "secret.key").write_bytes(Fernet.generate_key())

    done = ops.restore(_settings(data), tmp_path / "b")
    assert done.revision == migrate.script_head() and done.pending == []
    assert _rows(data / "flowyard.db", "SELECT name FROM tenants") == [("original",)]
    assert (data / "secret.key").read_bytes() == old_key
    assert (data / "flowyard.db").stat().st_mode & 0o777 == 0o600
    assert done.replaced is not None and done.replaced.parent == data
    assert _sha(done.replaced / "flowyard.db") == before
    assert (done.replaced / "secret.key").read_bytes() != old_key

    # Onto an empty data directory (a new machine) too.
    fresh = tmp_path / "fresh"
    done = ops.restore(_settings(fresh), tmp_path / "b")
    assert done.replaced is None
    assert _rows(fresh / "flowyard.db", "SELECT name FROM tenants") == [("original",)]


def test_restore_of_an_older_schema_reports_the_pending_migrations(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    migrate.upgrade(f"sqlite+aiosqlite:///{old / 'flowyard.db'}", "0007")
    ops.backup(_settings(old), tmp_path / "b")
    done = ops.restore(_settings(tmp_path / "new"), tmp_path / "b")
    assert done.revision == "0007" and done.pending == migrate.pending_revisions("0007") != []


@pytest.fixture
def holder(data: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process with the database open, as serve's pools keep it, then idle."""
    code = (
        "import sqlite3, sys\n"
        f"c = sqlite3.connect({str(data / 'flowyard.db')!r})\n"
        "c.execute('PRAGMA journal_mode=WAL'); c.execute('SELECT count(*) FROM tenants').fetchall()\n"
        "print('open', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    yield proc
    proc.kill()
    proc.wait()


def test_restore_refuses_a_database_another_process_has_open(
    data: Path, tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    ops.backup(_settings(data), tmp_path / "b")
    files = {p.name: _sha(p) for p in data.iterdir() if p.is_file()}
    assert ops.in_use(data / "flowyard.db")
    with pytest.raises(OpsError, match="stop the service"):
        ops.restore(_settings(data), tmp_path / "b")
    assert {p.name: _sha(p) for p in data.iterdir() if p.is_file()} == files
    assert not list(data.glob("replaced-*"))
    # Killed, not closed: the lock goes with the process; its WAL is kept with the replaced files.
    holder.kill()
    holder.wait()
    assert not ops.in_use(data / "flowyard.db")
    done = ops.restore(_settings(data), tmp_path / "b")
    assert done.replaced is not None and (done.replaced / "flowyard.db-wal").exists()


def _damaged(tmp_path: Path, data: Path, name: str) -> Path:
    b = tmp_path / name
    ops.backup(_settings(data), b)
    return b


def _rewrite_manifest(b: Path) -> None:
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["database"]["sha256"] = _sha(b / "flowyard.db")
    (b / "manifest.json").write_text(json.dumps(manifest))


def test_restore_refuses_half_or_damaged_backups(data: Path, tmp_path: Path) -> None:
    files = {p.name: _sha(p) for p in data.iterdir() if p.is_file()}

    def refused(b: Path, match: str) -> None:
        with pytest.raises(OpsError, match=match):
            ops.restore(_settings(data), b)
        assert {p.name: _sha(p) for p in data.iterdir() if p.is_file()} == files
        assert not list(data.glob("replaced-*")) and not list(data.glob("*.restoring"))

    refused(tmp_path / "nowhere", "not a backup directory")

    half = _damaged(tmp_path, data, "half")  # interrupted before the manifest was written
    (half / "manifest.json").unlink()
    refused(half, "did not finish")

    truncated = _damaged(tmp_path, data, "truncated")
    db = truncated / "flowyard.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    refused(truncated, "checksum")

    no_key = _damaged(tmp_path, data, "nokey")
    (no_key / "secret.key").unlink()
    refused(no_key, "missing")

    # Damaged pages with a matching checksum: integrity_check is what catches them.
    corrupt = _damaged(tmp_path, data, "corrupt")
    db = corrupt / "flowyard.db"
    raw = bytearray(db.read_bytes())
    page = 4096
    for n in range(2, len(raw) // page, 3):
        raw[n * page + 8 : n * page + 200] = os.urandom(192)
    db.write_bytes(bytes(raw))
    _rewrite_manifest(corrupt)
    refused(corrupt, "integrity_check|not a readable SQLite database")

    newer = _damaged(tmp_path, data, "newer")
    conn = sqlite3.connect(newer / "flowyard.db")
    conn.execute("UPDATE alembic_version SET version_num = 'ffff_from_the_future'")
    conn.commit()
    conn.close()
    _rewrite_manifest(newer)
    refused(newer, "unknown to this flowyard")

    garbage = _damaged(tmp_path, data, "garbage")
    (garbage / "manifest.json").write_text("{not json")
    refused(garbage, "damaged")


def test_postgresql_is_refused_with_the_pg_dump_pointer(tmp_path: Path) -> None:
    settings = _settings(tmp_path, database_url="postgresql+asyncpg://flowyard@127.0.0.1:1/flowyard")
    for fn in (ops.backup, ops.restore):
        with pytest.raises(OpsError, match="pg_dump"):
            fn(settings, tmp_path / "b")
    assert not (tmp_path / "b").exists()
