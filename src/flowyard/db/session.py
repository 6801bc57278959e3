"""Engine and session setup for SQLite (embedded) and PostgreSQL (scale-out).

Services take an ``AsyncSession`` and never commit; the caller owns the
transaction through ``Database.read()`` or ``Database.write()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from flowyard import metrics
from flowyard.db import sqlite_driver
from flowyard.errors import Conflict, StorageUnavailable
from flowyard.jsonvalue import dumps_stored, loads_stored

T = TypeVar("T")


# PostgreSQL: a pooled connection that sat unused this long is pinged at its next checkout.
PING_IDLE_SECONDS = 1.0


def _ping_when_idle(engine: sa.Engine) -> None:
    """Ping a PostgreSQL connection at checkout only when it was idle in the pool for
    ``PING_IDLE_SECONDS``; one the server closed is then replaced before anyone uses it (the
    pool retries the checkout on ``DisconnectionError``). Under load connections go back and
    forth within milliseconds and nothing is pinged. A connection the server closes within a
    second of its last use is met by the next statement instead: SQLAlchemy then invalidates
    it and every connection of the pool older than that moment (``Pool._invalidate``), a
    single-statement read (``db.fast.Fetch``) runs once more on a new one, and any other
    request fails as it would have failed in flight (``StorageUnavailable``, 503)."""

    @event.listens_for(engine, "checkin")
    def _idle_from(dbapi_connection: Any, record: Any) -> None:
        record.info["flowyard_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.pop("flowyard_idle_since", None)
        if since is None or time.monotonic() - since < PING_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # any failure: the pool tries a new connection
            raise sa.exc.DisconnectionError(f"idle connection failed its ping: {type(exc).__name__}") from exc


class Database:
    """One per process: an engine, a session factory and the dialect's quirks."""

    def __init__(self, url: str, *, pool_size: int = 40, echo: bool = False, direct: bool = True) -> None:
        self.url, self.pgbouncer = pgbouncer_option(sa.make_url(url))
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        kwargs: dict[str, Any] = {
            "echo": echo,
            # flowyard.jsonvalue: reading is total for numbers SQLite kept in an old column.
            "json_serializer": dumps_stored,
            "json_deserializer": loads_stored,
        }
        if self.is_sqlite:
            # One connection per concurrent session; SQLite itself serialises writers.
            # Connections are kept, never churned: opening one costs a thread, the PRAGMAs
            # and a cold page cache, which under load cost more than the queries.
            kwargs["pool_size"] = pool_size
            kwargs["max_overflow"] = 10
            # Reuse the most recent connection: its cache is warm and its synchronous
            # mode usually already the one wanted.
            kwargs["pool_use_lifo"] = True
            # One thread hop per statement instead of four (db/sqlite_driver.py).
            kwargs["connect_args"] = {
                "timeout": 30,
                "check_same_thread": False,
                "async_creator_fn": sqlite_driver.connect,
            }
        else:
            kwargs["pool_size"] = min(pool_size, 20)
            kwargs["max_overflow"] = 20
            # Not pool_pre_ping: with asyncpg its ping is three round trips (BEGIN, ";",
            # ROLLBACK) at every checkout, ~10 % of a list's CPU. Only a connection that sat in
            # the pool for PING_IDLE_SECONDS is pinged (_ping_when_idle), as a restart, a
            # failover or an idle timeout may have closed it unseen.
            # Conditional updates ("UPDATE ... WHERE status = 'inactive'") rely on
            # READ COMMITTED re-evaluating the WHERE clause against the newest row
            # version after a concurrent writer commits.
            kwargs["isolation_level"] = "READ COMMITTED"
            if self.pgbouncer:
                kwargs["connect_args"] = dict(PGBOUNCER_CONNECT_ARGS)
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine.sync_engine)
        else:
            _ping_when_idle(self.engine.sync_engine)
        self._writer = self.engine.execution_options(flowyard_immediate=True)
        self._relaxed_writer = self.engine.execution_options(flowyard_immediate=True, flowyard_relaxed=True)
        self._read_sessions = async_sessionmaker(self.engine, expire_on_commit=False, autoflush=False)
        self._write_sessions = async_sessionmaker(self._writer, expire_on_commit=False, autoflush=False)
        self._relaxed_sessions = async_sessionmaker(
            self._relaxed_writer, expire_on_commit=False, autoflush=False
        )
        # SQLite has one writer at a time anyway; queueing writers of this process
        # here is cheaper and fairer than SQLite's sleep-and-retry busy handler.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self.is_sqlite else None
        # Between processes (the API processes and the engine of `flowyard serve`), an
        # advisory file lock beside the database queues writers in the kernel: the next one
        # runs the moment the lock is free, where SQLite's busy handler sleeps and retries
        # (up to 100 ms a time).
        self._file_lock: _FileLock | None = None
        self._direct: _Direct | None = None
        self._inline: _InlineReader | None = None
        database = self.url.database
        if self.is_sqlite and database and database != ":memory:" and "mode=memory" not in str(self.url):
            private_sqlite_files(Path(database))
            self._file_lock = _FileLock(f"{database}-writelock")
            if direct:
                self._direct = _Direct(self.url, kwargs)
                self._inline = _InlineReader(database)

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reads; rolled back at the end."""
        async with self._read_sessions() as session:
            try:
                yield session
            except DBAPIError as exc:
                raise map_db_error(exc) from exc

    @contextlib.asynccontextmanager
    async def write(self, *, durable: bool = True) -> AsyncIterator[AsyncSession]:
        """A write transaction, committed when the block ends without error.

        ``durable=False`` (SQLite only) commits without waiting for the disk: for
        writes whose loss at a power cut is harmless because the queue repeats
        them (claims, lease renewals, recorded outcomes: the execution runs again).
        A later durable commit still persists them, as the WAL is append-only.

        On SQLite it starts with BEGIN IMMEDIATE, so two transactions that read
        first and write later cannot deadlock upgrading their locks.
        """
        lock = self._write_lock
        if lock is not None:
            await lock.acquire()
        file_lock = self._file_lock
        try:
            if file_lock is not None:
                await file_lock.acquire()
            factory = self._write_sessions if durable else self._relaxed_sessions
            async with factory() as session:
                try:
                    async with session.begin():
                        yield session
                        committing = time.perf_counter()
                    metrics.db_commit(time.perf_counter() - committing)
                except DBAPIError as exc:
                    raise map_db_error(exc) from exc
        finally:
            if file_lock is not None:
                file_lock.release()
            if lock is not None:
                lock.release()

    async def transact(self, fn: Callable[[AsyncSession], Awaitable[T]], *, durable: bool = True) -> T:
        """``fn(session)`` in one write transaction, committed when it returns: as
        ``async with write(durable=...) as session: return await fn(session)``.

        For the hot transactions (accept a batch of webhooks, claim, record outcomes). On a
        SQLite file the whole of ``fn`` runs on the database's own thread, in one hop, with
        every statement on that thread (see ``_Direct``): ``fn`` may await the session and
        nothing else, and must not touch the event loop or state its other tasks share
        unguarded. On PostgreSQL it is ``write()``.
        """
        direct = self._direct
        if direct is None:
            async with self.write(durable=durable) as session:
                return await fn(session)
        lock = self._write_lock
        assert lock is not None
        await lock.acquire()
        file_lock = self._file_lock
        try:
            if file_lock is not None:
                await file_lock.acquire()
            result, commit_seconds = await direct.run(fn, durable)
            metrics.db_commit(commit_seconds)
            return result
        except DBAPIError as exc:
            raise map_db_error(exc) from exc
        finally:
            if file_lock is not None:
                file_lock.release()
            lock.release()

    async def driver_rows(self, sql: str, args: list[Any], *, inline: bool) -> list[Any]:
        """SQLite: the rows of a read, straight from the driver (``fast.Fetch``). ``inline``: a
        read of a few index lookups, run at once on the calling thread (``_InlineReader``)
        where it can be (a file, and SQLite would not make it wait); otherwise, or for any
        longer read, on a pooled connection's thread, in one hop."""
        if inline and self._inline is not None:
            rows = self._inline.rows(sql, args)
            if rows is not None:
                return rows
        async with self.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            return list(await driver.execute_fetchall(sql, args))

    async def give_back_space(self, pages: int) -> int:
        """SQLite: hand up to ``pages`` free pages of the file back to the file system (the
        file shrinks at the next checkpoint); the number handed back. 0 on PostgreSQL, in
        memory, or for a file made before flowyard created its files in incremental
        auto-vacuum mode (``PRAGMA auto_vacuum`` 2; docs/operations.md says how to convert one).

        One short write transaction of its own, queued behind this process's writers.
        """
        database = self.url.database
        if self._file_lock is None or not database or pages <= 0:
            return 0
        lock = self._write_lock
        assert lock is not None
        await lock.acquire()
        try:
            await self._file_lock.acquire()
            return await asyncio.to_thread(_incremental_vacuum, database, pages)
        finally:
            self._file_lock.release()
            lock.release()

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
            return True
        except Exception:
            return False

    async def dispose(self) -> None:
        await self.engine.dispose()
        if self._inline is not None:
            self._inline.close()
        if self._direct is not None:
            await self._direct.dispose()
        if self._file_lock is not None:
            self._file_lock.close()


# Connection arguments for PgBouncer in transaction mode, where consecutive transactions
# of one client connection may run on different server connections, so nothing may
# outlive a transaction on the server. asyncpg's and SQLAlchemy's prepared-statement
# caches are off: every statement then uses PostgreSQL's unnamed prepared statement,
# parsed again at each execution (asyncpg re-sends Parse with Bind), instead of named
# ones ("__asyncpg_stmt_1__") that would be missing, or already taken, on the next
# server connection (PgBouncer < 1.21 does not track them; 1.21+ only with
# max_prepared_statements). Every statement of ours runs inside a transaction
# (READ COMMITTED, never autocommit), and the pool's pre-ping opens one too.
PGBOUNCER_CONNECT_ARGS: dict[str, Any] = {"statement_cache_size": 0, "prepared_statement_cache_size": 0}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def pgbouncer_option(url: sa.URL) -> tuple[sa.URL, bool]:
    """``url`` without flowyard's ``pgbouncer`` query option, and whether it was set.

    ``postgresql+asyncpg://user@pgbouncer:6432/db?pgbouncer=true`` says the URL points at
    PgBouncer in transaction mode (FLOWYARD_DATABASE_PGBOUNCER=true adds it).
    """
    value = url.query.get("pgbouncer")
    if value is None:
        return url, False
    text = (value if isinstance(value, str) else value[-1]).strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"the database URL option pgbouncer={text!r} is not one of true, false")
    on = text in _TRUE
    if on and url.get_backend_name() != "postgresql":
        raise ValueError("the database URL option pgbouncer=true is for PostgreSQL only")
    return url.difference_update_query(["pgbouncer"]), on


def asyncpg_dsn(url: str | sa.URL) -> str:
    """A plain asyncpg DSN for a SQLAlchemy PostgreSQL URL (for a direct connection such as
    LISTEN's), without the options only SQLAlchemy or flowyard understand."""
    plain, _ = pgbouncer_option(sa.make_url(url))
    plain = plain.difference_update_query(["prepared_statement_cache_size"])
    return plain.set(drivername="postgresql").render_as_string(hide_password=False)


def engine_kwargs(url: str | sa.URL) -> tuple[sa.URL, dict[str, Any]]:
    """URL and extra engine arguments for a short-lived engine (migrations): the same
    PgBouncer handling as ``Database``."""
    plain, pgbouncer = pgbouncer_option(sa.make_url(url))
    return plain, ({"connect_args": dict(PGBOUNCER_CONNECT_ARGS)} if pgbouncer else {})


class _FileLock:
    """An exclusive ``flock`` on a file, taken without blocking the event loop: at once when
    free, else in a thread that the kernel wakes when the holder lets go (or dies)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._held = False

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    async def acquire(self) -> None:
        try:
            fd = self._open()
        except OSError:
            return  # no lock file (read-only directory): SQLite's busy handler still serialises
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Shielded: a cancelled waiter must not leave a lock taken behind its back.
            task = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX))
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                await asyncio.wait([task])
                if not task.cancelled() and task.exception() is None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                raise
        self._held = True

    def release(self) -> None:
        if self._held and self._fd is not None:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def private_sqlite_files(path: Path) -> None:
    """The embedded database is readable by the service's user only: its directory is made
    0700 when created here, the file is created 0600 before SQLite opens it (SQLite gives its
    -wal and -shm files the database file's mode), and an existing file, -wal or -shm left
    more open by an older flowyard is set to 0600. A file owned by someone else is left as is."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(OSError):
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)


class _Direct:
    """The SQLite connection of ``Database.transact``: one thread, one connection, no
    asyncio bridge.

    A transaction runs on a synchronous SQLAlchemy ``Session`` over the standard library's
    ``sqlite3`` (the pysqlite dialect: the same SQL, types and PRAGMAs as the aiosqlite
    engine) on the database's own thread. The transaction's function is written against
    ``AsyncSession`` (PostgreSQL runs it as ``write()``); here it is handed a ``SessionBridge``
    whose awaitables are the synchronous session's calls, complete the moment they are
    awaited, so the function's coroutine is driven to its end in one step, with no greenlet
    switch or async adapter per statement: 13 to 17 % less of the thread's CPU per execution in
    batches of 8, about 5 % in batches of 32 (docs/performance.md). The thread runs one
    transaction at a time (``transact`` holds the
    process's write lock), so its one connection is never shared. Anything that would wait
    (a coroutine of the event loop awaited by mistake) is refused with ``RuntimeError`` and
    rolled back.
    """

    def __init__(self, url: sa.URL, kwargs: dict[str, Any]) -> None:
        connect_args = {k: v for k, v in kwargs["connect_args"].items() if k != "async_creator_fn"}
        self.engine = sa.create_engine(
            url.set(drivername="sqlite+pysqlite"),
            echo=kwargs.get("echo", False),
            json_serializer=kwargs["json_serializer"],
            json_deserializer=kwargs["json_deserializer"],
            connect_args=connect_args,
            poolclass=sa.pool.StaticPool,
        )
        _configure_sqlite(self.engine)
        writer = self.engine.execution_options(flowyard_immediate=True)
        relaxed = self.engine.execution_options(flowyard_immediate=True, flowyard_relaxed=True)
        self._durable = sessionmaker(writer, expire_on_commit=False, autoflush=False)
        self._relaxed = sessionmaker(relaxed, expire_on_commit=False, autoflush=False)
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="flowyard-sqlite"
        )

    async def run(self, fn: Callable[[AsyncSession], Awaitable[T]], durable: bool) -> tuple[T, float]:
        # In the caller's context, as asyncio.to_thread does: log lines keep their request's fields.
        context = contextvars.copy_context()
        done = asyncio.get_running_loop().run_in_executor(self._thread, context.run, self._whole, fn, durable)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            # The transaction ends (committed or rolled back) before the caller lets go of the
            # write locks: a cancelled caller never leaves a writer running behind its back.
            await asyncio.wait([done])
            raise

    def _whole(self, fn: Callable[[AsyncSession], Awaitable[T]], durable: bool) -> tuple[T, float]:
        with (self._durable if durable else self._relaxed)() as session, session.begin():
            result = _step_to_end(fn(cast(AsyncSession, SessionBridge(session))))
            committing = time.perf_counter()
        return result, time.perf_counter() - committing

    async def dispose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.engine.dispose)
        self._thread.shutdown(wait=False)


class _InlineReader:
    """Point reads of a SQLite file on the event loop's own thread: no thread hop at all.

    A read through the pool hands the statement to the connection's thread and the answer
    back (a queue put, a wake-up, a ``call_soon_threadsafe``): ~0.2 ms of CPU, where reading
    one flow by its primary key costs SQLite ~8 µs (docs/performance.md, "Flow API"). For such
    reads only (``fast.Fetch``: a few index lookups, never a scan), a connection of the
    calling thread runs them at once. It is read-only (``query_only``), in autocommit: each
    statement is its own read transaction, ended when its rows are fetched, so it never holds
    a WAL snapshot back or keeps a checkpoint waiting. It never waits either (``busy_timeout``
    0): where SQLite would make a reader wait (a WAL being recovered after a crash), the rows
    are not read here and the caller reads through the pool, which may wait without holding
    the loop. One connection per thread (``sqlite3`` connections belong to their thread)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._connections: dict[int, sqlite3.Connection] = {}
        self._pid = os.getpid()

    def _connection(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # a forked child never uses (nor closes) its parent's
            self._connections, self._pid = {}, os.getpid()
        key = threading.get_ident()
        conn = self._connections.get(key)
        if conn is None:
            conn = sqlite3.connect(self.database, timeout=0, isolation_level=None)
            conn.execute("PRAGMA query_only=ON")
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            self._connections[key] = conn
        return conn

    def rows(self, sql: str, args: list[Any]) -> list[Any] | None:
        try:
            return self._connection().execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return None
            raise

    def close(self) -> None:
        connections, self._connections = self._connections, {}
        for conn in connections.values():
            with contextlib.suppress(sqlite3.Error):  # another thread's: left to the collector
                conn.close()


class SessionBridge:
    """``AsyncSession``'s calls over a synchronous ``Session``, each complete when awaited.

    Only for a coroutine driven on the session's own thread (``_Direct``). The calls the
    hot transactions make are here; any other attribute is missing on purpose (a
    transaction that needs more adds it here, where the tests of ``transact`` run it).
    """

    __slots__ = ("_driver", "sync_session")

    def __init__(self, session: Session) -> None:
        self.sync_session = session
        self._driver: sqlite3.Connection | None = None

    def driver(self) -> sqlite3.Connection:
        """The transaction's ``sqlite3`` connection (begun: BEGIN IMMEDIATE has run), for the
        statements run on its cursor (``db/prepared.py``)."""
        if self._driver is None:
            connection = self.sync_session.connection().connection
            self._driver = cast(sqlite3.Connection, connection.driver_connection)
        return self._driver

    async def execute(self, statement: Any, params: Any = None, **kw: Any) -> Any:
        return self.sync_session.execute(statement, params, **kw)

    async def scalars(self, statement: Any, params: Any = None, **kw: Any) -> Any:
        return self.sync_session.scalars(statement, params, **kw)

    async def scalar(self, statement: Any, params: Any = None, **kw: Any) -> Any:
        return self.sync_session.scalar(statement, params, **kw)

    async def get(self, entity: Any, ident: Any, **kw: Any) -> Any:
        return self.sync_session.get(entity, ident, **kw)

    async def flush(self, objects: Any = None) -> None:
        self.sync_session.flush(objects)

    def add(self, instance: Any) -> None:
        self.sync_session.add(instance)

    def get_bind(self, *args: Any, **kw: Any) -> Any:
        return self.sync_session.get_bind(*args, **kw)


def _incremental_vacuum(database: str, pages: int) -> int:
    conn = sqlite3.connect(database, timeout=30, isolation_level=None)
    try:
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # INCREMENTAL
            return 0
        before = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        # One statement step frees one page: executescript steps it to the end.
        conn.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
        return before - int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    finally:
        conn.close()


def incremental_auto_vacuum(database: Path) -> bool:
    """Make a new, empty SQLite file one whose free pages can be handed back
    (``Database.give_back_space``): the mode can only be chosen before the first table.
    False (and nothing done) for a file that already holds a database."""
    if database.exists() and database.stat().st_size > 0:
        return False
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")  # writes the header: the mode is kept from now on
    finally:
        conn.close()
    return True


def _step_to_end(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its end in one step; it must not wait for anything."""
    steps = awaitable.__await__()
    try:
        steps.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    why = "a direct SQLite transaction awaited something that waits"
    with contextlib.suppress(StopIteration):
        steps.throw(RuntimeError(why))  # the transaction rolls back on its way out
    raise RuntimeError(why)


# SQLite's page cache per connection, in KiB, for the pool's connections and each thread's
# inline reader alike.
CACHE_KIB = 8192


def _configure_sqlite(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take over BEGIN from the driver so write transactions can say IMMEDIATE.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # WAL: readers never block the writer and the writer never blocks readers.
        cur.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed trigger survives power loss before we acknowledge it.
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        # Another process (a second worker) may hold the write lock briefly.
        cur.execute("PRAGMA busy_timeout=30000")
        # 8 MiB of page cache per connection (a pool keeps up to 40): memory stays
        # bounded as the database grows; the OS file cache does the rest.
        cur.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        options = conn.get_execution_options()
        relaxed = bool(options.get("flowyard_relaxed"))
        info = conn.connection.info
        if info.get("flowyard_relaxed", False) != relaxed:
            # Per connection and only on change: most transactions pay nothing for it.
            conn.exec_driver_sql(f"PRAGMA synchronous={'NORMAL' if relaxed else 'FULL'}")
            info["flowyard_relaxed"] = relaxed
        if options.get("flowyard_immediate"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


def is_unique_violation(exc: BaseException) -> bool:
    if isinstance(exc, IntegrityError):
        text = str(exc.orig).lower()
        return "unique" in text or "duplicate key" in text
    return False


def map_db_error(exc: DBAPIError) -> Exception:
    if isinstance(exc, IntegrityError):
        if is_unique_violation(exc):
            return Conflict("An object with these values already exists.")
        return Conflict("The change conflicts with stored data.")
    if isinstance(exc, OperationalError) or exc.connection_invalidated:
        return StorageUnavailable()
    return exc
