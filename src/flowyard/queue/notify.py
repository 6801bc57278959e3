"""Cross-process wake-ups: "work was enqueued" and "these executions finished".

Processes sharing one database tell each other about commits instead of polling
for them. Two events travel:

- ``WORK``: executions were enqueued; engines wake their worker and claim.
- finished: executions reached a final state; API processes complete the
  ``?wait=`` requests waiting for them, with the status and the result carried
  in the message when it is small (no database read), or the id alone (the
  waiter reads the row once).

Backends:

- PostgreSQL: ``LISTEN/NOTIFY``. ``stage()`` runs ``pg_notify`` in the caller's
  transaction, so the message is delivered only if, and once, it commits. The
  listener holds one dedicated, direct connection (``FLOWYARD_NOTIFY_DATABASE_URL``
  when the normal URL points at PgBouncer in transaction mode, where LISTEN
  cannot work).
- SQLite: datagram Unix sockets in a directory beside the database file
  (``<db>.notify/``), one per process; ``committed()`` sends to all of them
  after the commit. Nothing but the data directory is needed.

Delivery is best effort on both (a full socket buffer drops a datagram; a
listener reconnecting misses messages): polling at a longer interval stays as
the backstop, so a lost message costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from flowyard.db.session import asyncpg_dsn, pgbouncer_option

log = logging.getLogger(__name__)

CHANNEL = "flowyard"
WORK = b"w"
_FINISHED = b"f"
# PostgreSQL's NOTIFY payload limit is 8000 bytes; a datagram may be larger but
# the same bound keeps both backends alike.
_MAX_MESSAGE = 7000
# A result larger than this travels as its id only: the waiter reads the row.
_MAX_INLINE_RESULT = 2000
_SUN_PATH_MAX = 100

Finished = tuple[str, str, Any, Any]  # execution id, status, result, error
OnWork = Callable[[], None]
OnFinished = Callable[[list[tuple[str, tuple[str, Any, Any] | None]]], None]


def finished_messages(items: Iterable[Finished | str]) -> list[bytes]:
    """Messages announcing finished executions: a ``Finished`` carries its outcome
    when small enough, a bare id says "read the row"."""
    out: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for item in items:
        if isinstance(item, str):
            encoded = orjson.dumps([item])
        else:
            try:
                encoded = orjson.dumps(list(item))
            except TypeError:
                encoded = b""
            if not encoded or len(encoded) > _MAX_INLINE_RESULT:
                encoded = orjson.dumps([item[0]])
        if current and size + len(encoded) + 1 > _MAX_MESSAGE - 4:
            out.append(_FINISHED + b"[" + b",".join(current) + b"]")
            current, size = [], 0
        current.append(encoded)
        size += len(encoded) + 1
    if current:
        out.append(_FINISHED + b"[" + b",".join(current) + b"]")
    return out


def _decode(message: bytes) -> tuple[str, list[tuple[str, tuple[str, Any, Any] | None]]]:
    if message == WORK:
        return "work", []
    if not message.startswith(_FINISHED):
        raise ValueError("unknown message")
    items: list[tuple[str, tuple[str, Any, Any] | None]] = []
    for entry in orjson.loads(message[1:]):
        if len(entry) == 4:
            items.append((str(entry[0]), (str(entry[1]), entry[2], entry[3])))
        else:
            items.append((str(entry[0]), None))
    return "finished", items


class Notifier:
    """No cross-process channel (an in-memory database): only polling."""

    def __init__(self) -> None:
        self._on_work: list[OnWork] = []
        self._on_finished: list[OnFinished] = []

    @property
    def active(self) -> bool:
        return False

    def subscribe(self, *, on_work: OnWork | None = None, on_finished: OnFinished | None = None) -> None:
        if on_work is not None:
            self._on_work.append(on_work)
        if on_finished is not None:
            self._on_finished.append(on_finished)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def stage(self, session: AsyncSession, messages: list[bytes]) -> None:
        """Send ``messages`` when the caller's transaction commits (PostgreSQL)."""
        return None

    def committed(self, messages: list[bytes]) -> None:
        """Send ``messages`` now that the caller's transaction committed (SQLite)."""
        return None

    def _dispatch(self, message: bytes) -> None:
        try:
            kind, items = _decode(message)
        except Exception:
            log.warning("ignored a malformed notification")
            return
        if kind == "work":
            for work_cb in self._on_work:
                work_cb()
        else:
            for finished_cb in self._on_finished:
                finished_cb(items)


class PostgresNotifier(Notifier):
    def __init__(self, dsn: str | None, *, reconnect_delay: float = 1.0) -> None:
        """``dsn``: the direct connection to LISTEN on; None: only send (``stage``)."""
        super().__init__()
        self.dsn = dsn
        self.reconnect_delay = reconnect_delay
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    @property
    def active(self) -> bool:
        return self._connected.is_set()

    async def start(self) -> None:
        if self.dsn is None:
            return
        self._task = asyncio.create_task(self._listen(), name="flowyard-listen")
        # Wait briefly for the first connection so the first events are not missed; if the
        # database is not reachable yet, the task keeps trying and polling covers meanwhile.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self._connected.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def stage(self, session: AsyncSession, messages: list[bytes]) -> None:
        for message in messages:
            await session.execute(
                sa.text("SELECT pg_notify(:channel, :payload)"),
                {"channel": CHANNEL, "payload": message.decode()},
            )

    async def _listen(self) -> None:
        import asyncpg

        while True:
            conn = None
            lost = asyncio.Event()
            try:
                conn = await asyncpg.connect(self.dsn)
                conn.add_termination_listener(lambda _c, ev=lost: ev.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self._connected.set()
                # Whatever was sent while not listening is found by the pollers.
                for cb in self._on_work:
                    cb()
                await lost.wait()
                log.warning("notification connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("notification connection failed (%s); retrying", type(exc).__name__)
            finally:
                self._connected.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.close(timeout=1))
            await asyncio.sleep(self.reconnect_delay)

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._dispatch(payload.encode())


class LocalNotifier(Notifier):
    """Datagram Unix sockets in one directory: each process binds one, senders write to all."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._sock: socket.socket | None = None
        self._path: str | None = None

    @property
    def active(self) -> bool:
        return self._sock is not None

    async def start(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(self.directory, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            # Someone else's directory (say, planted in /tmp) could read or forge notices.
            log.warning("%s is not a private directory of this user: notifications off", self.directory)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        path = str(self.directory / f"{os.getpid()}-{os.urandom(4).hex()}.sock")
        sock.bind(path)
        os.chmod(path, 0o600)
        with contextlib.suppress(OSError):  # room for bursts of messages before one is dropped
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock, self._path = sock, path
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    async def close(self) -> None:
        sock, path = self._sock, self._path
        self._sock = self._path = None
        if sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def committed(self, messages: list[bytes]) -> None:
        sock = self._sock
        if sock is None or not messages:
            return
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if not name.endswith(".sock"):
                continue
            path = str(self.directory / name)
            if path == self._path:
                continue  # this process was told directly
            for message in messages:
                try:
                    sock.sendto(message, path)
                except (ConnectionRefusedError, FileNotFoundError):
                    # Nobody bound: a process that died without cleaning up.
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    break
                except OSError:
                    break  # its buffer is full: it will poll

    def _readable(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                message = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._dispatch(message)


def socket_directory(database_file: Path) -> Path:
    """``<database>.notify`` beside the database file; a short directory under the
    temporary directory when that path would not fit a Unix socket address."""
    directory = database_file.resolve().parent / f"{database_file.name}.notify"
    if len(str(directory)) + 20 <= _SUN_PATH_MAX:
        return directory
    digest = hashlib.sha256(str(database_file.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"flowyard-{os.getuid()}-{digest}"


def open_notifier(database_url: str, notify_url: str | None = None) -> Notifier:
    """The channel for processes sharing this database."""
    url = sa.make_url(database_url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        _, pgbouncer = pgbouncer_option(url)
        if pgbouncer and not notify_url:
            # LISTEN through PgBouncer in transaction mode would listen on whichever server
            # connection the statement borrowed, and hear nothing: send, do not listen.
            log.warning(
                "the database URL points at PgBouncer and FLOWYARD_NOTIFY_DATABASE_URL is not set: "
                "no LISTEN; processes find new work and finished executions by polling"
            )
            return PostgresNotifier(None)
        return PostgresNotifier(asyncpg_dsn(notify_url or url))
    if backend == "sqlite" and url.database and url.database != ":memory:" and "mode=memory" not in str(url):
        return LocalNotifier(socket_directory(Path(url.database)))
    return Notifier()
