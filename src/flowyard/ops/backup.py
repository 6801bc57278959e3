"""``flowyard backup`` and ``flowyard restore`` for the embedded SQLite database.

A backup is a directory (mode 0700: it holds the key that decrypts stored secrets) with

- ``flowyard.db``: a consistent copy made with SQLite's online backup API while the service
  runs (one read transaction: in WAL mode writers go on meanwhile; the copy is the database as
  of one commit), converted to a single file (``journal_mode=DELETE``), mode 0600;
- ``secret.key``: the key file of the data directory, mode 0600 (absent when the key comes
  from ``FLOWYARD_SECRET_KEY``: keep that value with the backup yourself);
- ``manifest.json``, written last: schema revision, sizes and SHA-256 of both files. A
  directory without it is an unfinished backup, and restore refuses it.

Restore refuses while any process has the database open (see ``in_use``), verifies the
backup (manifest, checksums, ``PRAGMA integrity_check``, a schema revision this code knows)
before touching anything, and moves the files it replaces into ``replaced-<time>/`` beside
the database instead of deleting them.

PostgreSQL is backed up with ``pg_dump``/``pg_restore`` (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from flowyard.clock import isoformat, utcnow
from flowyard.config import Settings
from flowyard.db import migrate
from flowyard.ops import OpsError

MANIFEST = "manifest.json"
DATABASE = "flowyard.db"
KEY = "secret.key"
FORMAT = 1
# SQLite's "dead man switch" in the wal-index: every open connection to a WAL database holds a
# shared lock on this byte of the -shm file (https://www.sqlite.org/walformat.html, "the DMS
# lock"), whatever process or tool it is; the lock goes with the process, even on SIGKILL.
_SHM_DMS_BYTE = 128
_POSTGRES_HINT = (
    "flowyard {0} works on the embedded SQLite database only; this deployment uses {1}: "
    "use pg_dump/pg_restore (docs/operations.md, 'Backup and restore')"
)


def sqlite_file(settings: Settings) -> Path | None:
    """The database file of an embedded deployment; ``None`` for PostgreSQL or memory."""
    url = sa.make_url(settings.resolved_database_url())
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return None if "mode=memory" in str(url) else Path(url.database).resolve()


def sqlite_path(settings: Settings, command: str) -> Path:
    """``sqlite_file``, or ``OpsError`` pointing a PostgreSQL deployment to pg_dump."""
    path = sqlite_file(settings)
    if path is None:
        backend = sa.make_url(settings.resolved_database_url()).get_backend_name()
        if backend != "sqlite":
            raise OpsError(_POSTGRES_HINT.format(command, backend))
        raise OpsError(f"flowyard {command} needs a database file, not an in-memory database")
    return path


def in_use(database: Path) -> bool:
    """Whether any process has ``database`` open: a running ``serve`` or ``worker`` (their
    pools keep connections open), a ``sqlite3`` shell, anything. Checked on the lock SQLite
    itself keeps, so it needs nothing from the service and no stale pid file can fool it."""
    try:
        fd = os.open(f"{database}-shm", os.O_RDWR)
    except FileNotFoundError:  # no connection since the last one closed cleanly
        return False
    try:
        try:
            # POSIX record locks, as SQLite's unix VFS takes them; taken and let go at once.
            # (A process's own locks never conflict with it: this process has no connection.)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _SHM_DMS_BYTE)
        except OSError:
            return True
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, _SHM_DMS_BYTE)
    finally:
        os.close(fd)
    return False


@dataclass
class Inspection:
    integrity: list[str]
    revision: str | None

    @property
    def ok(self) -> bool:
        return self.integrity == ["ok"]


def inspect(path: Path, *, quick: bool = False) -> Inspection:
    """``PRAGMA integrity_check`` (or ``quick_check``) and the schema revision of a database
    file, opened read-only. ``OpsError`` when it is not a readable SQLite database."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise OpsError(f"{path}: cannot open: {exc}") from None
    try:
        pragma = "quick_check" if quick else "integrity_check"
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}")]
        try:
            found = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        except sqlite3.OperationalError:  # no such table: never migrated
            found = []
        return Inspection(rows, str(found[0][0]) if found else None)
    except sqlite3.DatabaseError as exc:
        raise OpsError(f"{path}: not a readable SQLite database: {exc}") from None
    finally:
        conn.close()


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 whatever the umask (it is opened again by name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.fchmod(fd, 0o600)
    os.close(fd)


def _copy_private(src: Path, dst: Path) -> None:
    _private_file(dst)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
        fout.flush()
        os.fsync(fout.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Backup:
    path: Path
    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def backup(settings: Settings, dest: Path) -> Backup:
    """Copy the embedded database and the key file into the new directory ``dest``."""
    database = sqlite_path(settings, "backup")
    if not database.exists():
        raise OpsError(f"no database at {database} (FLOWYARD_DATA_DIR / FLOWYARD_DATABASE_URL)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise OpsError(f"{dest} exists and is not an empty directory; name a new one")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    dest.chmod(0o700)
    partial = dest / f"{DATABASE}.partial"
    _private_file(partial)
    src = sqlite3.connect(database, timeout=30)
    try:
        dst = sqlite3.connect(partial)
        try:
            # pages=-1: the whole database in one step, inside one read transaction of the
            # source, so the copy is one commit's state (stepwise copies restart on every write).
            src.backup(dst, pages=-1)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise OpsError(f"backup of {database} failed: {exc}") from None
    finally:
        src.close()
    checked = inspect(partial)
    if not checked.ok:
        raise OpsError(f"the copy fails integrity_check: {'; '.join(checked.integrity[:5])}")
    with open(partial, "rb+") as fh:
        os.fsync(fh.fileno())
    partial.rename(dest / DATABASE)

    notes: list[str] = []
    key: dict[str, Any] | None = None
    key_file = settings.data_dir.resolve() / KEY
    if settings.configured_secret_key() is not None:
        source = "environment"
        notes.append(
            "the secret key comes from FLOWYARD_SECRET_KEY and is not in the backup: keep it with it"
        )
    elif key_file.exists():
        source = "file"
        _copy_private(key_file, dest / KEY)
        key = {"file": KEY, "sha256": _sha256(dest / KEY)}
    else:
        source = "none"
        notes.append(f"no secret key at {key_file}: nothing was encrypted with one yet")

    manifest = {
        "format": FORMAT,
        "createdAt": isoformat(utcnow()),
        "flowyardVersion": version("flowyard"),
        "source": str(database),
        "revision": checked.revision,
        "database": {
            "file": DATABASE,
            "bytes": (dest / DATABASE).stat().st_size,
            "sha256": _sha256(dest / DATABASE),
        },
        "secretKeySource": source,
        "secretKey": key,
    }
    tmp = dest / f"{MANIFEST}.partial"
    _private_file(tmp)
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.rename(dest / MANIFEST)
    _fsync_dir(dest)
    return Backup(dest, manifest, notes)


def verify(path: Path) -> dict[str, Any]:
    """The manifest of a complete, intact backup directory; ``OpsError`` naming what is wrong."""
    manifest_file = path / MANIFEST
    if not path.is_dir():
        raise OpsError(f"{path} is not a backup directory")
    if not manifest_file.exists():
        raise OpsError(f"{path} has no {MANIFEST}: not a backup, or one that did not finish")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        if manifest["format"] != FORMAT:
            raise OpsError(f"{path}: backup format {manifest['format']!r}; this flowyard reads {FORMAT}")
        files = [manifest["database"]] + ([manifest["secretKey"]] if manifest["secretKey"] else [])
        expected = {str(f["file"]): str(f["sha256"]) for f in files}
    except (ValueError, KeyError, TypeError) as exc:
        raise OpsError(f"{manifest_file} is damaged: {exc!r}") from None
    for name, digest in expected.items():
        if name not in (DATABASE, KEY):
            raise OpsError(f"{manifest_file} names an unexpected file {name!r}")
        if not (path / name).is_file():
            raise OpsError(f"{path / name} is missing")
        if _sha256(path / name) != digest:
            raise OpsError(f"{path / name} does not match its checksum: damaged or incomplete")
    checked = inspect(path / DATABASE)
    if not checked.ok:
        raise OpsError(f"{path / DATABASE} fails integrity_check: {'; '.join(checked.integrity[:5])}")
    if checked.revision is None:
        raise OpsError(f"{path / DATABASE} has no schema revision: not a flowyard database")
    try:
        migrate.pending_revisions(checked.revision)
    except LookupError:
        raise OpsError(
            f"{path / DATABASE} is at schema revision {checked.revision}, unknown to this flowyard "
            f"(made by a newer version?): restore it with that version"
        ) from None
    return dict(manifest, revision=checked.revision)


@dataclass
class Restored:
    revision: str
    replaced: Path | None
    pending: list[str]
    notes: list[str] = field(default_factory=list)


def restore(settings: Settings, src: Path) -> Restored:
    """Put the backup ``src`` in place of the embedded database (and key file)."""
    database = sqlite_path(settings, "restore")
    manifest = verify(src)
    if in_use(database):
        raise OpsError(
            f"{database} is open in a running process (flowyard serve or worker?): stop the "
            "service before restoring"
        )
    data_dir = settings.data_dir.resolve()
    key_file = data_dir / KEY
    restore_key = manifest["secretKey"] is not None
    notes: list[str] = []
    if restore_key and settings.configured_secret_key() is not None:
        notes.append(
            "FLOWYARD_SECRET_KEY is set and wins over the restored secret.key: stored secrets "
            "decrypt only if it is the key the backup was made with"
        )
    if not restore_key and manifest["secretKeySource"] == "environment":
        notes.append("the backup was made with FLOWYARD_SECRET_KEY: set the same key")

    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Copy first, beside the target (same filesystem: the rename below is atomic).
    staged_db = database.with_name(f"{database.name}.restoring")
    staged_key = key_file.with_name(f"{KEY}.restoring")
    for staged in (staged_db, staged_key):
        staged.unlink(missing_ok=True)
    _copy_private(src / DATABASE, staged_db)
    if restore_key:
        _copy_private(src / KEY, staged_key)

    stamp = utcnow().strftime("%Y%m%dT%H%M%S%fZ")
    aside = database.parent / f"replaced-{stamp}"
    old = [Path(f"{database}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")]
    if restore_key:
        old.append(key_file)
    old = [p for p in old if p.exists()]
    if old:
        aside.mkdir(mode=0o700)
        for p in old:
            p.rename(aside / p.name)
    staged_db.rename(database)
    if restore_key:
        staged_key.rename(key_file)
    _fsync_dir(database.parent)
    if key_file.parent != database.parent:
        with contextlib.suppress(OSError):
            _fsync_dir(key_file.parent)
    pending = migrate.pending_revisions(manifest["revision"])
    return Restored(manifest["revision"], aside if old else None, pending, notes)
