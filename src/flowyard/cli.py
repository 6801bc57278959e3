"""The ``flowyard`` command line."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
import sqlalchemy as sa

from flowyard.clock import isoformat, utcnow
from flowyard.components import builtins
from flowyard.components.registry import Registry
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.errors import FlowyardError
from flowyard.iam import permissions as perms
from flowyard.iam import service as iam
from flowyard.iam.models import User

T = TypeVar("T")


def _settings() -> Settings:
    return Settings()


def _setup_logging(settings: Settings) -> None:
    from flowyard import logconfig

    logconfig.setup(settings.log_format, settings.log_level)


def _with_db(settings: Settings, fn: Callable[[Database], Awaitable[T]]) -> T:
    async def run() -> T:
        db = Database(settings.resolved_database_url(), direct=settings.sqlite_direct)
        try:
            return await fn(db)
        finally:
            await db.dispose()

    try:
        return asyncio.run(run())
    except FlowyardError as exc:
        raise click.ClickException(exc.message) from None


_SERVE_LOCK: list[int] = []  # the lock's descriptor, open for the life of the process


def _hold_serve_lock(settings: Settings, address: str) -> None:
    """One ``serve`` with its engine per SQLite database: a second ``flowyard serve`` (or ``make
    run``) on the same ``./data``, on another port, refuses to start and names the first instead of
    serving beside it. The lock is an ``flock`` on ``<database>.serve-lock``, held by this process
    (not inherited by its children: they are started with exec) and released by the kernel when
    the process ends however it ends, so a crash never leaves a stale lock. PostgreSQL is meant
    for many processes and takes no lock; ``serve --no-engine`` and ``worker`` take none either."""
    url = sa.engine.make_url(settings.resolved_database_url())
    if not url.get_backend_name().startswith("sqlite") or not url.database or url.database == ":memory:":
        return
    import fcntl
    import os

    database = Path(url.database).resolve()
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = database.with_name(database.name + ".serve-lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise click.ClickException(
            f"{database} is already served by {holder}. Stop that one first, or give this one "
            "its own data directory (FLOWYARD_DATA_DIR)."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"flowyard serve (pid {os.getpid()}, {address})".encode(), 0)
    _SERVE_LOCK.append(fd)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flowyard")
def main() -> None:
    """flowyard: integration flows behind a REST API.

    Configuration comes from FLOWYARD_* environment variables (see docs/configuration.md).
    """


@main.command()
@click.option("--host", default=None, help="Bind address (default FLOWYARD_HOST or 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default FLOWYARD_PORT or 8000).")
@click.option("--no-engine", is_flag=True, help="Serve the API only; run `flowyard worker` elsewhere.")
@click.option("--no-migrate", is_flag=True, help="Do not upgrade the database schema at start.")
@click.option(
    "--api-processes",
    type=click.IntRange(min=1),
    default=None,
    help="API processes on the one socket (default FLOWYARD_API_PROCESSES, else CPU cores - 1).",
)
def serve(
    host: str | None, port: int | None, no_engine: bool, no_migrate: bool, api_processes: int | None
) -> None:
    """Run the API, the worker and the scheduler: with several API processes, a supervisor
    starts them on one socket beside one engine process; with one, all in one process."""
    settings = _settings()
    _setup_logging(settings)
    if not no_engine and settings.serve_lock:
        host_shown = host or settings.host
        port_shown = port if port is not None else settings.port
        _hold_serve_lock(settings, f"{host_shown}:{port_shown}")
    if not no_migrate:
        from flowyard.ops import OpsError, schema

        try:
            schema.upgrade_apart()  # in a child: Alembic never loads into this process
        except OpsError as exc:
            raise click.ClickException(str(exc)) from None

    async def first_admin(db: Database) -> None:
        async with db.write() as session:
            await iam.ensure_first_admin(
                session,
                username=settings.admin_username,
                password=settings.admin_password.get_secret_value() if settings.admin_password else None,
                data_dir=settings.data_dir,
            )

    _with_db(settings, first_admin)
    host = host or settings.host
    port = port if port is not None else settings.port
    count = api_processes or settings.api_process_count()
    if count > 1:
        from flowyard import metrics, supervisor

        # Every child records into this run's own directory; any API process sums them all.
        metrics_dir = metrics.multiproc_dir()
        try:
            code = supervisor.serve(
                host=host,
                port=port,
                api_processes=count,
                engine=not no_engine,
                grace=settings.stop_grace_seconds,
                drain=settings.drain_seconds,
            )
        finally:
            metrics.remove_multiproc_dir(metrics_dir)
        sys.exit(code)
    _run_api(settings, run_engine=not no_engine, host=host, port=port)


@main.command("_api", hidden=True)
def api_child() -> None:
    """An API process of `flowyard serve`, on the supervisor's socket."""
    from flowyard import supervisor

    settings = _settings()
    _setup_logging(settings)
    _run_api(settings, run_engine=False, sock=supervisor.inherited_socket())


def _run_api(
    settings: Settings,
    *,
    run_engine: bool,
    host: str | None = None,
    port: int | None = None,
    sock: Any = None,
) -> None:
    import uvicorn

    from flowyard import logconfig
    from flowyard.app import create_app
    from flowyard.http_protocol import HttpLimits, protocol_class

    app = create_app(settings, run_engine=run_engine)
    limits = HttpLimits.from_settings(settings)
    config = uvicorn.Config(
        app,
        host=host or settings.host,
        port=port if port is not None else settings.port,
        log_level=settings.log_level.lower(),
        log_config=logconfig.uvicorn_log_config(settings.log_format, settings.log_level),
        access_log=settings.access_log,
        loop="uvloop",
        # httptools, with the header, timeout and drain rules of flowyard.http_protocol.
        http=protocol_class(limits),
        # No WebSocket route: no WebSocket protocol (the websockets library, ~8 MiB, stays
        # unloaded; an Upgrade request is answered as plain HTTP).
        ws="none",
        timeout_keep_alive=limits.keepalive_timeout,  # type: ignore[arg-type]  # a float works
        timeout_graceful_shutdown=int(settings.stop_grace_seconds) + 5,
    )
    from flowyard.server import GracefulServer

    server = GracefulServer(config, app, drain_seconds=settings.drain_seconds)
    server.run(sockets=[sock] if sock is not None else None)


@main.command()
def worker() -> None:
    """Run only the engine (worker, scheduler, reconciler), for scale-out."""
    from flowyard.enginehost import run_standalone

    settings = _settings()
    _setup_logging(settings)
    asyncio.run(run_standalone(settings))


@main.command()
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def migrate(revision: str) -> None:
    """Create or upgrade the database schema."""
    settings = _settings()
    _setup_logging(settings)
    from flowyard.ops import schema

    schema.upgrade(settings, revision)
    click.echo(f"database at {revision}")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
def backup(path: Path) -> None:
    """Copy the embedded database (online, consistent) and secret.key into the new directory
    PATH (mode 0700). PostgreSQL: use pg_dump (docs/operations.md)."""
    from flowyard.ops import backup as ops_backup

    made = _ops(lambda: ops_backup.backup(_settings(), path))
    for note in made.notes:
        click.echo(f"note: {note}", err=True)
    db = made.manifest["database"]
    click.echo(f"backup of revision {made.manifest['revision']} in {path} ({db['bytes']} bytes)")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
def restore(path: Path) -> None:
    """Replace the embedded database (and secret.key) with the backup in PATH. Refuses while a
    process has the database open; the replaced files are kept in replaced-<time>/."""
    from flowyard.ops import backup as ops_backup

    done = _ops(lambda: ops_backup.restore(_settings(), path))
    for note in done.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"restored revision {done.revision} from {path}")
    if done.replaced is not None:
        click.echo(f"replaced files kept in {done.replaced}")
    if done.pending:
        click.echo(
            f"{len(done.pending)} migrations pending: flowyard serve (or flowyard migrate) applies them"
        )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout, for scripts.")
@click.option("--quick", is_flag=True, help="SQLite: PRAGMA quick_check instead of integrity_check.")
@click.option(
    "--stuck-after",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds past its expiry after which a lease counts as stuck (default FLOWYARD_LEASE_SECONDS).",
)
@click.option(
    "--quarantine",
    is_flag=True,
    help="Replace each JSON cell that cannot be read with a JSON string of its raw text, and fail "
    "the queued or running executions whose input it was.",
)
@click.option(
    "--recount",
    is_flag=True,
    help="Rebuild the flow lists' counts from the flows when they differ (after a change made by hand).",
)
def check(as_json: bool, quick: bool, stuck_after: float | None, quarantine: bool, recount: bool) -> None:
    """Report schema revision, pending migrations, reachability, integrity, queue depth, stuck
    leases, JSON cells that cannot be read and flow counts that disagree with the flows; exit
    status 1 when something is wrong. Changes nothing, but with --quarantine or --recount."""
    from flowyard.ops import check as ops_check

    settings = _settings()
    report = _ops(
        lambda: asyncio.run(
            ops_check.check(
                settings, quick=quick, stuck_after=stuck_after, quarantine=quarantine, recount=recount
            )
        )
    )
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else ops_check.render(report))
    sys.exit(0 if report.ok else 1)


def _ops(fn: Callable[[], T]) -> T:
    from flowyard.ops import OpsError

    try:
        return fn()
    except OpsError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
def components() -> None:
    """List installed components, and those that failed to load."""
    registry = Registry.load(builtins.ALL)
    for c in registry.all():
        click.echo(f"{c.id:12} {', '.join(sorted(c.functions)):30} {c.description}")
    for name, error in registry.failures.items():
        click.echo(f"FAILED {name}: {error}", err=True)


# -- users ------------------------------------------------------------------------


@main.group()
def users() -> None:
    """Manage user accounts."""


@users.command("create")
@click.option("--username", required=True, help="E-mail address used to log in.")
@click.option(
    "--password", prompt=True, hide_input=True, confirmation_prompt=True, help="Prompted if omitted."
)
@click.option("--firstname", default="", help="First name.")
@click.option("--lastname", default="", help="Last name.")
@click.option("--tenant", default=None, help="Tenant id or name.")
@click.option("--permission", "permissions", multiple=True, help="Permission to grant (repeatable).")
@click.option("--role", "roles", multiple=True, help="Role id to assign (repeatable).")
@click.option("--admin", is_flag=True, help="Grant 'all' (global administrator).")
def users_create(
    username: str,
    password: str,
    firstname: str,
    lastname: str,
    tenant: str | None,
    permissions: tuple[str, ...],
    roles: tuple[str, ...],
    admin: bool,
) -> None:
    """Create a user. A tenant member without --permission gets the member defaults."""
    granted = list(permissions)
    if admin:
        granted.append(perms.ALL)
    elif tenant and not granted and not roles:
        granted = list(perms.MEMBER_DEFAULT)

    async def run(db: Database) -> User:
        async with db.write() as session:
            tenant_id = (await iam.tenant_by_ref(session, tenant)).id if tenant else None
            return await iam.create_user(
                session,
                username=username,
                password=password,
                firstname=firstname,
                lastname=lastname,
                tenant_id=tenant_id,
                permissions=granted,
                role_ids=roles,
            )

    user = _with_db(_settings(), run)
    click.echo(
        json.dumps(
            {
                "id": user.id,
                "username": user.username,
                "tenant": user.tenant_id,
                "permissions": user.permissions,
            }
        )
    )


@users.command("list")
def users_list() -> None:
    """List users."""

    async def run(db: Database) -> list[User]:
        async with db.read() as session:
            return list((await session.scalars(sa.select(User).order_by(User.id))).all())

    for user in _with_db(_settings(), run):
        click.echo(
            f"{user.id}  {user.username:40} {user.status:9} tenant={user.tenant_id or '-'} "
            f"permissions={','.join(user.permissions) or '-'}"
        )


@users.command("disable")
@click.argument("username")
def users_disable(username: str) -> None:
    """Disable a user and revoke its tokens."""

    async def run(db: Database) -> None:
        async with db.write() as session:
            await iam.set_user_status(session, username, "DISABLED")

    _with_db(_settings(), run)
    click.echo(f"{username} disabled")


# -- tenants, roles, tokens ------------------------------------------------------------


@main.group()
def tenants() -> None:
    """Manage tenants."""


@tenants.command("create")
@click.argument("name")
def tenants_create(name: str) -> None:
    """Create a tenant; prints its id."""

    async def run(db: Database) -> str:
        async with db.write() as session:
            return (await iam.create_tenant(session, name)).id

    click.echo(_with_db(_settings(), run))


@main.group()
def roles() -> None:
    """Manage roles."""


@roles.command("create")
@click.argument("name")
@click.option("--permission", "permissions", multiple=True, required=True, help="Permission (repeatable).")
@click.option("--tenant", default=None, help="Tenant id or name; omitted: a global role.")
@click.option("--description", default=None, help="What the role is for.")
def roles_create(
    name: str, permissions: tuple[str, ...], tenant: str | None, description: str | None
) -> None:
    """Create a role; prints its id."""

    async def run(db: Database) -> str:
        async with db.write() as session:
            scope = (await iam.tenant_by_ref(session, tenant)).id if tenant else None
            role = await iam.create_role(
                session, name=name, permissions=permissions, description=description, scope=scope
            )
            return role.id

    click.echo(_with_db(_settings(), run))


@main.group()
def tokens() -> None:
    """Manage API tokens."""


@tokens.command("create")
@click.option("--user", "username", required=True, help="Username the token acts as.")
@click.option("--description", default=None, help="What the token is for.")
@click.option("--expires-in-days", type=float, default=None, help="Lifetime; omitted: no expiry.")
@click.option("--permission", "permissions", multiple=True, help="Narrow the token (repeatable).")
def tokens_create(
    username: str, description: str | None, expires_in_days: float | None, permissions: tuple[str, ...]
) -> None:
    """Create an API token; prints it once."""

    async def run(db: Database) -> dict[str, Any]:
        async with db.write() as session:
            user = await iam.user_by_username(session, username)
            expires = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None
            token, text = await iam.issue_api_token(
                session,
                user,
                description=description,
                expires_at=expires,
                permissions=list(permissions) or None,
            )
            return {"id": token.id, "token": text, "expiresAt": isoformat(expires) if expires else None}

    click.echo(json.dumps(_with_db(_settings(), run)))


# -- templates -----------------------------------------------------------------------


@main.group()
def templates() -> None:
    """Manage flow templates."""


@templates.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def templates_import(file: Path) -> None:
    """Import templates from a JSON file (one object or an array)."""
    from flowyard.templates import service as template_service

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise click.ClickException(f"{file} is not valid JSON: {exc}") from None
    registry = Registry.load(builtins.ALL)

    async def run(db: Database) -> list[str]:
        async with db.write() as session:
            return await template_service.import_templates(session, data, registry)

    for template_id in _with_db(_settings(), run):
        click.echo(template_id)


# -- flows: export and import (SPEC §12), for keeping flows in git -----------------------


@main.group()
def flows() -> None:
    """Export and import flows as portable documents."""


async def _acting_as(session: Any, username: str) -> Any:
    """The principal of ``--as USER``: its own permissions and its roles', as a token of its
    would have (a disabled user cannot act)."""
    from flowyard.iam.principal import Principal
    from flowyard.iam.roles import effective_permissions

    user = await iam.user_by_username(session, username)
    if user.status == "DISABLED":
        raise click.ClickException(f"User {username} is disabled.")
    return Principal(
        user.id, user.username, user.tenant_id, await effective_permissions(session, user), "cli"
    )


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:80] or "flow"


@flows.command("export")
@click.argument("flow_ids", nargs=-1, required=True)
@click.option("--as", "username", required=True, help="Username whose view of the flows is exported.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="A file (one flow), or a directory (one <name>.json per flow). Omitted: standard output.",
)
def flows_export(flow_ids: tuple[str, ...], username: str, out: Path | None) -> None:
    """Write flows as portable documents (no ids, owners or secrets; credentials by name)."""
    from flowyard.flows import service as flow_service

    to_dir = out is not None and (out.is_dir() or len(flow_ids) > 1 or str(out).endswith("/"))
    if out is None and len(flow_ids) > 1:
        raise click.UsageError("Several flows need --out DIR.")

    async def run(db: Database) -> list[dict[str, Any]]:
        async with db.read() as session:
            principal = await _acting_as(session, username)
            return [await flow_service.export_flow(session, principal, fid) for fid in flow_ids]

    docs = _with_db(_settings(), run)
    if out is None:
        click.echo(json.dumps(docs[0], indent=2, ensure_ascii=False))
        return
    if not to_dir:
        out.write_text(json.dumps(docs[0], indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        click.echo(str(out))
        return
    out.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    for fid, doc in zip(flow_ids, docs, strict=True):
        name = _slug(doc["name"])
        if name in used:
            name = f"{name}-{fid}"
        used.add(name)
        path = out / f"{name}.json"
        path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        click.echo(str(path))


@flows.command("import")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--as", "username", required=True, help="Username who will own the new flows.")
def flows_import(source: Path, username: str) -> None:
    """Create flows from a document, or from every *.json document of a directory. All or
    nothing: if any document has a problem, every problem is printed and no flow is created."""
    from flowyard.errors import InvalidInput
    from flowyard.flows import service as flow_service

    files = sorted(source.glob("*.json")) if source.is_dir() else [source]
    if not files:
        raise click.ClickException(f"{source} holds no *.json documents.")
    registry = Registry.load(builtins.ALL)

    class Refused(Exception):
        pass

    async def run(db: Database) -> list[tuple[Path, str]]:
        made: list[tuple[Path, str]] = []
        failed: list[str] = []
        try:
            async with db.write() as session:
                principal = await _acting_as(session, username)
                for path in files:
                    try:
                        flow = await flow_service.import_flow(session, principal, path.read_bytes(), registry)
                        made.append((path, flow.id))
                    except InvalidInput as exc:
                        failed += [f"{path}: {p.message}" for p in exc.problems]
                if failed:
                    raise Refused()  # rolls the whole import back
        except Refused:
            raise click.ClickException("nothing was imported:\n" + "\n".join(failed)) from None
        return made

    for path, fid in _with_db(_settings(), run):
        click.echo(f"{fid} {path}")


if __name__ == "__main__":
    main()
