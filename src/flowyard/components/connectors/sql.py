"""The ``sql`` component: a parameterised statement against PostgreSQL, MySQL/MariaDB or
SQLite, named by a credential URL.

Parameters are bound by the driver (``:name`` placeholders, values from JSONata over
the message): message data is never formatted into the statement text. Each
credential gets one small SQLAlchemy async engine (pool) per runner process,
closed after ``FLOWYARD_CONNECTOR_IDLE_SECONDS`` unused. The server host is vetted
by the outbound network policy and the pool connects to that address only.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import orjson
from pydantic import Field, field_validator, model_validator

from flowyard.components.builtins import ComponentError, _Fields
from flowyard.components.connectors.common import (
    Pools,
    check_mapper,
    credential_key,
    credential_url,
    json_size,
    jsonable,
    render,
    size_text,
    vet_host,
)
from flowyard.components.context import StepContext
from flowyard.components.registry import Component, Message
from flowyard.components.retry import NonRetryable

if TYPE_CHECKING:  # SQLAlchemy's async engine is imported when a sql step first needs it, so
    # runner processes of flows without a sql node do not carry it (about 20 MB each).
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from flowyard.config import Settings

_SCHEMES = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mariadb": 3306}
# Query parameters a credential URL may carry; anything else (host=, unix_socket=, ...)
# could point the driver somewhere the network policy never saw.
_QUERY_ALLOWED = {"postgresql": {"ssl"}, "mysql": {"charset"}}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SqlFields(_Fields):
    statement: str = Field(
        min_length=1,
        max_length=100_000,
        description="SQL with :name placeholders (write \\: for a literal colon). Values are bound "
        "by the driver, never formatted into the text.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Placeholder name -> JSONata over the message data (or a constant number, boolean "
        "or null). Objects and arrays are bound as JSON text.",
    )
    output: Literal["each", "all"] = Field(
        "all",
        description="query: 'each' emits one message per row, 'all' one message {rows, count}.",
    )
    maxRows: int = Field(
        1000, ge=1, le=100_000, description="query: more rows than this fail the step (add a LIMIT)."
    )
    timeout: float = Field(30.0, gt=0, le=300, description="Statement (and connect) timeout, seconds.")

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, expression in value.items():
            if not _NAME.match(name):
                raise ValueError(f"parameter name {name!r} is not an identifier")
            check_mapper(expression)
        return value

    @model_validator(mode="after")
    def _placeholders(self) -> SqlFields:
        from sqlalchemy import text

        wanted = set(text(self.statement).compile().params)
        missing = sorted(wanted - set(self.params))
        if missing:
            raise ValueError(f"placeholders without a value in params: {', '.join(missing)}")
        unused = sorted(set(self.params) - wanted)
        if unused:
            raise ValueError(f"params not used by the statement: {', '.join(unused)}")
        return self


def _authorize(action: int, *_args: Any) -> int:
    # A flow may use its own database file, never open (or write) another one.
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class _ConfinedSqlite(sqlite3.Connection):
    """A SQLite connection that cannot ATTACH other files (nor VACUUM INTO one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.set_authorizer(_authorize)


_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SAFE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_SQLITE_URL = "sql: a SQLite url is sqlite:///<file>, a relative name inside the flow's own directory"


def sqlite_owner_dir(tenant: str | None, owner_user: str | None) -> str:
    """The sub-directory of ``FLOWYARD_SQL_SQLITE_DIR`` a flow's SQLite files live in: its
    tenant's (``tenant-<id>``), or for a tenantless flow its owner user's (``user-<id>``). An id
    that is not a plain name is hashed (``tenant.<sha256>``), so no id spells a path."""
    if tenant:
        kind, ident = "tenant", tenant
    elif owner_user:
        kind, ident = "user", owner_user
    else:
        raise NonRetryable("sql: SQLite needs a flow with a tenant or an owner user (it has neither)")
    if _SAFE_ID.match(ident):
        return f"{kind}-{ident}"
    return f"{kind}.{hashlib.sha256(ident.encode()).hexdigest()}"


def _sqlite_path(raw_url: str, settings: Settings, tenant: str | None, owner_user: str | None) -> Path:
    """The file a ``sqlite:///name`` credential names, inside the flow's own directory (created
    0700 on first use). Only plain relative names are accepted: no absolute path, ``..``, URI
    form (``file:``, ``?mode=``, ``vfs=``) or host; a symlink leading out is refused after
    resolving."""
    root = settings.sql_sqlite_dir
    if root is None:
        raise NonRetryable(
            "sql: SQLite credentials are refused unless FLOWYARD_SQL_SQLITE_DIR names the directory "
            "flows may use"
        )
    parts = urlsplit(raw_url)
    if parts.scheme.lower() != "sqlite" or parts.netloc or parts.query or parts.fragment or "?" in raw_url:
        raise NonRetryable(_SQLITE_URL)
    name = unquote(parts.path)
    if not name.startswith("/"):
        raise NonRetryable(_SQLITE_URL)
    name = name[1:]  # sqlite:///a.db: a.db in the flow's directory
    pieces = name.split("/")
    if not name or not all(_SAFE_PART.match(p) and p not in (".", "..") for p in pieces):
        raise NonRetryable(
            f"{_SQLITE_URL} (letters, digits, '_', '-' and '.'; no absolute path, '..' or URI form): "
            f"{name[:100]!r} is refused"
        )
    base = root.resolve()
    base.mkdir(parents=True, exist_ok=True)
    own = base / sqlite_owner_dir(tenant, owner_user)
    try:
        own.mkdir(mode=0o700)
    except FileExistsError:
        pass
    if own.is_symlink() or not own.is_dir():
        raise NonRetryable("sql: the flow's SQLite directory is not a plain directory")
    own = own.resolve()
    path = (own / name).resolve()
    if path == own or not path.is_relative_to(own):
        raise NonRetryable("sql: the SQLite file must lie inside the flow's own directory")
    return path


def _is_sqlite(credentials: dict[str, Any]) -> bool:
    raw = credentials.get("url")
    return isinstance(raw, str) and raw.strip().lower().startswith(("sqlite", "file:"))


async def _make_engine(credentials: dict[str, Any], ctx: StepContext, seconds: float) -> AsyncEngine:
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import create_async_engine

    settings = ctx.settings
    if _is_sqlite(credentials):
        path = _sqlite_path(str(credentials["url"]).strip(), settings, ctx.tenant, ctx.owner_user)
        return create_async_engine(
            URL.create("sqlite+aiosqlite", database=str(path)),
            connect_args={"factory": _ConfinedSqlite, "timeout": seconds},
            pool_size=2,
            max_overflow=3,
        )
    ep = credential_url(credentials, "sql", _SCHEMES)
    family = "postgresql" if ep.scheme in ("postgresql", "postgres") else "mysql"
    query = dict(parse_qsl(ep.query))
    refused = sorted(set(query) - _QUERY_ALLOWED[family])
    if refused:
        raise NonRetryable(f"sql: the credential url may not set {', '.join(refused)}")
    database = unquote(ep.path.lstrip("/")) or None
    address = await vet_host(settings, ep.host, ep.port, within=seconds)
    url = URL.create(
        "postgresql+asyncpg" if family == "postgresql" else "mysql+aiomysql",
        username=ep.username,
        password=ep.password,
        host=address,
        port=ep.port,
        database=database,
        query=query,
    )
    connect_args: dict[str, Any] = (
        {"timeout": seconds, "server_settings": {"application_name": "flowyard"}}
        if family == "postgresql"
        else {"connect_timeout": seconds, "async_creator_fn": _single_statement_mysql}
    )
    return create_async_engine(
        url, connect_args=connect_args, pool_size=2, max_overflow=3, pool_pre_ping=True, pool_recycle=1800
    )


async def _single_statement_mysql(*args: Any, **kwargs: Any) -> Any:
    """An aiomysql connection without the MULTI_STATEMENTS capability, which aiomysql always
    asks for: the server then refuses ``SELECT 1; DROP TABLE t`` as a syntax error, so one step
    is one statement on every driver (asyncpg prepares every statement and SQLite's execute
    takes one, both refusing several)."""
    import aiomysql
    from pymysql.constants import CLIENT

    conn = aiomysql.Connection(*args, **kwargs)
    conn.client_flag &= ~CLIENT.MULTI_STATEMENTS
    await conn._connect()
    return conn


async def _dispose(engine: AsyncEngine) -> None:
    await engine.dispose()


_POOLS: Pools[AsyncEngine] = Pools(_dispose)


def _bind(value: Any) -> Any:
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return value


async def _limit_statement_time(conn: AsyncConnection, seconds: float) -> None:
    """The server stops the statement itself (the client-side timeout is the backstop)."""
    from sqlalchemy import text

    dialect = conn.dialect
    if dialect.name == "postgresql":
        # Transaction-local: safe behind PgBouncer in transaction mode.
        await conn.execute(
            text("SELECT set_config('statement_timeout', :ms, true)"), {"ms": str(int(seconds * 1000))}
        )
    elif dialect.name in ("mysql", "mariadb"):
        if getattr(dialect, "is_mariadb", False):
            await conn.execute(text("SET SESSION max_statement_time = :s"), {"s": seconds})
        else:
            await conn.execute(text("SET SESSION max_execution_time = :ms"), {"ms": int(seconds * 1000)})


def _db_error(exc: BaseException) -> str:
    """The driver's own message (SQLAlchemy's wrapper would add the statement and parameters)."""
    orig = getattr(exc, "orig", None) or exc
    # SQLAlchemy's asyncpg adapter wraps the driver's exception; name the driver's class.
    named = orig.__cause__ if isinstance(orig.__cause__, Exception) else orig
    message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return f"{type(named).__name__}: {message}"


def _several(statement: str) -> bool:
    """Whether the text looks like more than one statement (for the error's hint only: the
    drivers are what refuse them)."""
    return ";" in statement.strip().rstrip(";")


async def _run(message: Message, ctx: StepContext, *, query: bool) -> Any:
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import text

    f: SqlFields = ctx.fields
    data = message["data"]
    values = {name: _bind(render(expression, data)) for name, expression in f.params.items()}
    creds = ctx.credentials or {}
    key = credential_key("sql", creds, ctx.settings)
    if _is_sqlite(creds):  # the same url names another file for another tenant: never share its pool
        key += ":" + sqlite_owner_dir(ctx.tenant, ctx.owner_user)
    cap = ctx.settings.connector_max_result_bytes
    statement = text(f.statement)
    try:
        async with (
            asyncio.timeout(f.timeout + 2),
            _POOLS.use(
                key, lambda: _make_engine(creds, ctx, f.timeout), ctx.settings.connector_idle_seconds
            ) as engine,
            engine.begin() as conn,
        ):
            await _limit_statement_time(conn, f.timeout)
            if not query:
                result = await conn.execute(statement, values)
                return {"data": {"rowCount": result.rowcount}, "metadata": message["metadata"]}
            stream = await conn.stream(statement, values)
            rows: list[dict[str, Any]] = []
            size = 0
            async for row in stream.mappings():
                if len(rows) >= f.maxRows:
                    raise NonRetryable(
                        f"sql: the query returned more than {f.maxRows} rows (maxRows); add a LIMIT"
                    )
                item = {str(k): jsonable(v) for k, v in row.items()}
                size += json_size(item)
                if size > cap:
                    raise NonRetryable(
                        f"sql: the result exceeds {size_text(cap)} (FLOWYARD_CONNECTOR_MAX_RESULT_BYTES)"
                    )
                rows.append(item)
    except TimeoutError:
        raise ComponentError(f"sql: timed out after {f.timeout:g} s") from None
    except sa_exc.DBAPIError as exc:
        if exc.connection_invalidated:
            await _POOLS.discard(key)
        hint = " (a sql step runs one statement)" if _several(f.statement) else ""
        # The database away or busy may come back; a statement it refuses (syntax, a constraint,
        # bad data, permissions) is refused again.
        retryable = exc.connection_invalidated or isinstance(
            exc, sa_exc.OperationalError | sa_exc.InterfaceError
        )
        raise ComponentError(f"sql: {_db_error(exc)}{hint}", retryable=retryable) from None
    except (OSError, sa_exc.SQLAlchemyError) as exc:
        raise ComponentError(f"sql: {_db_error(exc)}") from None
    meta = message["metadata"]
    if f.output == "each":
        return [{"data": row, "metadata": {**meta, "rowIndex": i}} for i, row in enumerate(rows)]
    return {"data": {"rows": rows, "count": len(rows)}, "metadata": meta}


async def sql_query(message: Message, ctx: StepContext) -> Any:
    return await _run(message, ctx, query=True)


async def sql_execute(message: Message, ctx: StepContext) -> Any:
    return await _run(message, ctx, query=False)


COMPONENT = Component(
    id="sql",
    description="Run a parameterised SQL statement against PostgreSQL, MySQL/MariaDB or SQLite. "
    "Credentials: {url} (postgresql://user:pw@host/db, mysql://..., sqlite:///file), optional {password}.",
    functions={"query": sql_query, "execute": sql_execute},
    default_function="query",
    fields=SqlFields,
    function_descriptions={
        "query": "Emit the rows: one message per row (output=each) or one message {rows, count}.",
        "execute": "Run an INSERT/UPDATE/DELETE/DDL statement; emit {rowCount}.",
    },
)
