"""The sql component against the real PostgreSQL and MariaDB on this machine, and SQLite files."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from flowyard.clock import utcnow
from flowyard.components.builtins import ComponentError
from flowyard.components.connectors import sql
from flowyard.components.connectors.common import vet_host
from flowyard.config import Settings
from flowyard.queue.store import Claimed, Outcome
from flowyard.runtime.runner import CompiledFlow, run_execution
from tests.conftest import wait_until
from tests.connectors.conftest import REGISTRY, outputs, require_server, step, step_error
from tests.engine.test_processes import _free_port

PG = {"url": "postgresql://postgres@127.0.0.1:5432/test"}
MARIADB = {"url": "mysql://root@127.0.0.1:3306/test"}
INJECTIONS = [
    "x'); DROP TABLE {table}; --",
    "' OR '1'='1",
    "Robert'); DELETE FROM {table} WHERE ('1'='1",
    ":name",
    "\\'; SELECT 1; --",
]


@pytest.fixture(params=["postgresql", "mariadb"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[dict[str, Any], str]]:
    """(credentials, a fresh table name) on each real server."""
    if request.param == "postgresql":
        require_server("PostgreSQL", 5432)
        creds = PG
    else:
        require_server("MariaDB", 3306)
        creds = MARIADB
    yield creds, f"orders_{uuid.uuid4().hex[:10]}"


async def _exec(http: httpx.AsyncClient, settings: Settings, creds: dict[str, Any], statement: str) -> Any:
    out = await step(http, settings, "sql", "execute", {"statement": statement}, creds)
    return outputs(out)[0]


async def test_insert_and_query_bind_message_data_as_values(
    http: httpx.AsyncClient, settings: Settings, server: tuple[dict[str, Any], str]
) -> None:
    creds, table = server
    await _exec(http, settings, creds, f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name VARCHAR(200))")
    try:
        names = [s.format(table=table) for s in INJECTIONS]
        for i, name in enumerate(names):
            out = await step(
                http,
                settings,
                "sql",
                "execute",
                {
                    "statement": f"INSERT INTO {table} (id, name) VALUES (:id, :name)",
                    "params": {"id": "id", "name": "name"},
                },
                creds,
                {"id": i + 1, "name": name},
            )
            assert outputs(out) == [{"rowCount": 1}]
        # A value that looks like SQL matches only itself: no row is widened by "' OR '1'='1".
        out = await step(
            http,
            settings,
            "sql",
            "query",
            {"statement": f"SELECT id, name FROM {table} WHERE name = :n", "params": {"n": "n"}},
            creds,
            {"n": "' OR '1'='1"},
        )
        assert outputs(out) == [{"rows": [{"id": 2, "name": "' OR '1'='1"}], "count": 1}]
        out = await step(
            http,
            settings,
            "sql",
            "query",
            {"statement": f"SELECT id, name FROM {table} ORDER BY id", "output": "each"},
            creds,
        )
        expected = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
        each = next(s for s in out.steps if s.node_id == "c")
        assert each.messages_out == len(names) and outputs(out) == expected[: len(each.output)]
        out = await step(
            http, settings, "sql", "query", {"statement": f"SELECT id, name FROM {table} ORDER BY id"}, creds
        )
        assert outputs(out) == [{"rows": expected, "count": len(names)}]
    finally:
        await _exec(http, settings, creds, f"DROP TABLE {table}")


async def test_too_many_rows_fail_the_step(
    http: httpx.AsyncClient, settings: Settings, server: tuple[dict[str, Any], str]
) -> None:
    creds, table = server
    await _exec(http, settings, creds, f"CREATE TABLE {table} (id INTEGER)")
    try:
        await _exec(http, settings, creds, f"INSERT INTO {table} VALUES (1), (2), (3)")
        fields = {"statement": f"SELECT id FROM {table} ORDER BY id", "maxRows": 2}
        error = step_error(await step(http, settings, "sql", "query", fields, creds))
        assert "more than 2 rows" in error
        out = await step(http, settings, "sql", "query", {**fields, "maxRows": 3}, creds)
        assert outputs(out) == [{"rows": [{"id": 1}, {"id": 2}, {"id": 3}], "count": 3}]
    finally:
        await _exec(http, settings, creds, f"DROP TABLE {table}")


async def test_statement_errors_and_timeouts_are_step_errors(
    http: httpx.AsyncClient, settings: Settings, server: tuple[dict[str, Any], str]
) -> None:
    creds, table = server
    error = step_error(await step(http, settings, "sql", "query", {"statement": "SELEC 1"}, creds))
    assert error.startswith("sql: ") and "syntax" in error.lower()
    error = step_error(
        await step(http, settings, "sql", "query", {"statement": f"SELECT * FROM {table}"}, creds)
    )
    assert table in error
    sleep = "SELECT pg_sleep(5)" if creds is PG else "SELECT SLEEP(5)"
    error = step_error(
        await step(http, settings, "sql", "query", {"statement": sleep, "timeout": 0.5}, creds)
    )
    # Stopped by the server's own statement timeout, not only abandoned by the client.
    assert "statement timeout" in error or "max_statement_time" in error, error


async def test_bad_credentials_and_unreachable_server(
    http: httpx.AsyncClient, settings: Settings, server: tuple[dict[str, Any], str]
) -> None:
    creds, _table = server
    scheme = creds["url"].split(":", 1)[0]
    bad = {"url": f"{scheme}://nosuchuser:wrong@127.0.0.1:{5432 if creds is PG else 3306}/test"}
    error = step_error(await step(http, settings, "sql", "query", {"statement": "SELECT 1"}, bad))
    assert "nosuchuser" in error and "wrong" not in error
    closed = {"url": f"{scheme}://u@127.0.0.1:{_free_port()}/test"}
    error = step_error(
        await step(http, settings, "sql", "query", {"statement": "SELECT 1", "timeout": 3}, closed)
    )
    assert error.startswith("sql: ") and ("refused" in error.lower() or "can't connect" in error.lower()), (
        error
    )


async def test_loopback_database_refused_by_default_policy(
    http: httpx.AsyncClient, closed_settings: Settings
) -> None:
    """flowyard's own PostgreSQL on 127.0.0.1 is out of a flow's reach unless the operator opens it."""
    error = step_error(await step(http, closed_settings, "sql", "query", {"statement": "SELECT 1"}, PG))
    assert "refusing to connect to 127.0.0.1" in error and "FLOWYARD_OUTBOUND_ALLOW_NETWORKS" in error


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("localhost", "loopback"),
        ("10.1.2.3", "private network"),
        ("169.254.169.254", "cloud metadata"),
        ("::ffff:192.168.1.5", "private network"),
    ],
)
async def test_vet_host_refuses_private_destinations(
    closed_settings: Settings, host: str, reason: str
) -> None:
    with pytest.raises(ComponentError, match=reason):
        await vet_host(closed_settings, host, 5432, within=3)


async def test_vet_host_resolves_once_and_returns_the_vetted_address(settings: Settings) -> None:
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["10.9.9.9", "127.0.0.1"]

    # The private address is refused, the allowed loopback one is the one to connect to.
    assert await vet_host(settings, "db.internal.test", 5432, within=3, resolver=resolver) == "127.0.0.1"
    assert calls == ["db.internal.test"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1/test?host=/var/run/postgresql",
        "mysql://root@127.0.0.1/test?unix_socket=/run/mysqld/mysqld.sock",
    ],
)
async def test_driver_parameters_that_bypass_the_policy_are_refused(
    http: httpx.AsyncClient, settings: Settings, url: str
) -> None:
    error = step_error(await step(http, settings, "sql", "query", {"statement": "SELECT 1"}, {"url": url}))
    assert "may not set" in error


async def test_sqlite_files_only_under_the_configured_directory(
    http: httpx.AsyncClient, settings: Settings, closed_settings: Settings, tmp_path: Path
) -> None:
    creds = {"url": "sqlite:///orders.db"}
    await _exec(http, settings, creds, "CREATE TABLE t (v TEXT)")
    out = await step(
        http,
        settings,
        "sql",
        "execute",
        {"statement": "INSERT INTO t VALUES (:v)", "params": {"v": "v"}},
        creds,
        {"v": "a'b"},
    )
    assert outputs(out) == [{"rowCount": 1}]
    out = await step(http, settings, "sql", "query", {"statement": "SELECT v FROM t"}, creds)
    assert outputs(out) == [{"rows": [{"v": "a'b"}], "count": 1}]
    assert (tmp_path / "tenant-t1" / "orders.db").exists()  # the test flow's tenant is t1
    for url in ("sqlite:////etc/passwd", "sqlite:///../outside.db", "sqlite:///sub/../../outside.db"):
        error = step_error(
            await step(http, settings, "sql", "query", {"statement": "SELECT 1"}, {"url": url})
        )
        assert "a relative name inside the flow's own directory" in error, (url, error)
    assert not (tmp_path.parent / "outside.db").exists()
    no_dir = closed_settings.model_copy(update={"sql_sqlite_dir": None})
    error = step_error(await step(http, no_dir, "sql", "query", {"statement": "SELECT 1"}, creds))
    assert "SQLite credentials are refused" in error


async def test_sqlite_cannot_attach_or_write_other_files(
    http: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    creds = {"url": "sqlite:///mine.db"}
    victim = tmp_path.parent / f"victim-{uuid.uuid4().hex[:6]}.db"
    for statement in (f"ATTACH DATABASE '{victim}' AS v", f"VACUUM INTO '{victim}'"):
        error = step_error(await step(http, settings, "sql", "execute", {"statement": statement}, creds))
        assert error.startswith("sql: "), error
    assert not victim.exists()


async def test_pool_is_shared_per_credential_and_closed_when_idle(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    require_server("PostgreSQL", 5432)
    quick = settings.model_copy(update={"connector_idle_seconds": 0.3})
    await sql._POOLS.close_all()
    for _ in range(3):
        outputs(await step(http, quick, "sql", "query", {"statement": "SELECT 1 AS one"}, PG))
    assert len(sql._POOLS) == 1
    outputs(
        await step(http, quick, "sql", "query", {"statement": "SELECT 1 AS one"}, {**PG, "note": "other"})
    )
    assert len(sql._POOLS) == 2

    async def closed() -> bool:
        return len(sql._POOLS) == 0

    assert await wait_until(closed, within=10)
    # and the server no longer holds our connections
    conn = await asyncpg.connect(PG["url"])
    try:

        async def gone() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'flowyard' AND pid <> pg_backend_pid()"
            )
            return n == 0

        assert await wait_until(gone, within=10)
    finally:
        await conn.close()


def test_fields_validation_names_missing_and_unused_parameters() -> None:
    component = REGISTRY.get("sql")
    assert component is not None
    problems = component.validate_fields({"statement": "SELECT :a, :b", "params": {"a": "x", "c": "y"}})
    assert problems and "b" in problems[0][1] and "c" in problems[0][1]
    assert component.validate_fields({"statement": "SELECT 1", "params": {"1x": "y"}})[0][0] == ".params"
    assert component.validate_fields({"statement": "SELECT :a", "params": {"a": "$$$("}})
    assert component.validate_fields({"statement": "SELECT :a", "params": {"a": "x"}}) == []


def test_outbound_allow_networks_has_a_general_name_and_keeps_the_old_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOWYARD_OUTBOUND_ALLOW_NETWORKS", "10.1.0.0/16")
    assert Settings().http_allow_networks == ["10.1.0.0/16"]
    monkeypatch.delenv("FLOWYARD_OUTBOUND_ALLOW_NETWORKS")
    monkeypatch.setenv("FLOWYARD_HTTP_ALLOW_NETWORKS", "127.0.0.0/8,::1")
    assert Settings().http_allow_networks == ["127.0.0.0/8", "::1"]
    # The runner processes get their settings by field name.
    assert Settings(
        **Settings(http_allow_networks=["10.0.0.0/8"]).model_dump(mode="json")
    ).http_allow_networks == ["10.0.0.0/8"]


async def _as_owner(
    http: httpx.AsyncClient,
    settings: Settings,
    tenant: str | None,
    owner_user: str | None,
    function: str,
    fields: dict[str, Any],
    creds: dict[str, Any],
    data: Any = None,
) -> Outcome:
    """One sql step in a flow of ``tenant`` (or tenantless, owned by ``owner_user``)."""
    graph = {
        "nodes": [
            {"id": "in", "componentId": "webhook"},
            {
                "id": "c",
                "componentId": "sql",
                "function": function,
                "fields": fields,
                "credentials_id": "cred",
            },
        ],
        "edges": [{"source": "in", "target": "c"}],
    }
    flow = CompiledFlow.compile(
        flow_id="f" * 24, version=1, tenant=tenant, owner_user=owner_user, graph=graph, registry=REGISTRY
    )
    claimed = Claimed(
        id="e" * 24,
        flow_id="f" * 24,
        flow_version=1,
        tenant=tenant,
        owner_user=owner_user,
        trigger="webhook",
        input=data or {},
        attempts=1,
        created_at=utcnow(),
        scheduled_for=None,
    )
    return await run_execution(flow, claimed, settings=settings, http=http, credentials={"cred": creds})


TENANT_A, TENANT_B = "a" * 24, "b" * 24


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_sqlite_each_tenant_has_its_own_directory(
    http: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    """Issue 17: tenant A's credential sqlite:///tenant-b-private.db read the row tenant B wrote."""
    private = {"url": "sqlite:///tenant-b-private.db"}
    create = {"statement": "CREATE TABLE secrets (v TEXT)"}
    assert outputs(await _as_owner(http, settings, TENANT_B, "u" * 24, "execute", create, private))
    insert = {"statement": "INSERT INTO secrets VALUES ('of b')"}
    assert outputs(await _as_owner(http, settings, TENANT_B, "u" * 24, "execute", insert, private))
    read = {"statement": "SELECT v FROM secrets"}
    assert outputs(await _as_owner(http, settings, TENANT_B, "u" * 24, "query", read, private)) == [
        {"rows": [{"v": "of b"}], "count": 1}
    ]
    b_dir = tmp_path / f"tenant-{TENANT_B}"
    assert (b_dir / "tenant-b-private.db").is_file()
    assert b_dir.stat().st_mode & 0o777 == 0o700
    # The same spelling from tenant A (same runner process, so also a pool keyed apart) names A's
    # own, empty file; every other spelling of B's file is refused.
    error = step_error(await _as_owner(http, settings, TENANT_A, "v" * 24, "query", read, private))
    assert "no such table: secrets" in error, error
    assert (tmp_path / f"tenant-{TENANT_A}" / "tenant-b-private.db").is_file()
    spellings = [
        f"sqlite:///../tenant-{TENANT_B}/tenant-b-private.db",
        f"sqlite:///..%2Ftenant-{TENANT_B}%2Ftenant-b-private.db",
        f"sqlite:///%2e%2e/tenant-{TENANT_B}/tenant-b-private.db",
        f"sqlite:////{b_dir}/tenant-b-private.db",
        f"sqlite://localhost/{b_dir}/tenant-b-private.db",
        f"sqlite:///file:{b_dir}/tenant-b-private.db",
        f"file:{b_dir}/tenant-b-private.db",
        f"file:///{b_dir}/tenant-b-private.db",
        f"sqlite:///file:../tenant-{TENANT_B}/tenant-b-private.db?mode=ro&uri=true",
        "sqlite:///tenant-b-private.db?mode=ro&uri=true",
        "sqlite:///tenant-b-private.db?vfs=unix-none",
        "sqlite:///tenant-b-private.db%3Fvfs=unix-none",
        "sqlite:///tenant-b-private.db#x",
        "sqlite:///:memory:",
        "sqlite:///",
        "sqlite:///.",
        f"sqlite:///./../tenant-{TENANT_B}/tenant-b-private.db",
        f"sqlite:///sub/../../tenant-{TENANT_B}/tenant-b-private.db",
        f"sqlite:///..\\tenant-{TENANT_B}\\tenant-b-private.db",
        "sqlite:///tenant-b-private.db\x00",
        f"SQLITE:///../tenant-{TENANT_B}/tenant-b-private.db",
    ]
    for url in spellings:
        out = await _as_owner(http, settings, TENANT_A, "v" * 24, "query", read, {"url": url})
        error = step_error(out)
        assert error.startswith("sql: "), (url, error)
        assert "of b" not in str(out.steps), url
    # Nor can A create a file in B's directory, or anywhere outside its own.
    before = _tree(tmp_path)
    for url in spellings:
        await _as_owner(http, settings, TENANT_A, "v" * 24, "execute", create, {"url": url})
    assert _tree(tmp_path) == before
    assert _tree(b_dir) == ["tenant-b-private.db"]


async def test_sqlite_symlink_out_of_the_directory_is_refused(
    http: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    a_dir = tmp_path / f"tenant-{TENANT_A}"
    a_dir.mkdir(mode=0o700)
    b_dir = tmp_path / f"tenant-{TENANT_B}"
    b_dir.mkdir(mode=0o700)
    (a_dir / "link.db").symlink_to(b_dir / "b.db")
    (a_dir / "dir").symlink_to(b_dir)
    read = {"statement": "SELECT 1 AS one"}
    for url in ("sqlite:///link.db", "sqlite:///dir/b.db"):
        error = step_error(await _as_owner(http, settings, TENANT_A, None, "query", read, {"url": url}))
        assert "inside the flow's own directory" in error, error
    assert not (b_dir / "b.db").exists()
    # A tenant directory that is itself a symlink (to B's) is refused too.
    c = "c" * 24
    (tmp_path / f"tenant-{c}").symlink_to(b_dir)
    error = step_error(await _as_owner(http, settings, c, None, "query", read, {"url": "sqlite:///b.db"}))
    assert "not a plain directory" in error, error
    assert not (b_dir / "b.db").exists()


async def test_sqlite_tenantless_users_are_confined_to_their_own_directory(
    http: httpx.AsyncClient, settings: Settings, tmp_path: Path
) -> None:
    creds = {"url": "sqlite:///mine.db"}
    create = {"statement": "CREATE TABLE t (v TEXT)"}
    insert = {"statement": "INSERT INTO t VALUES ('of u1')"}
    read = {"statement": "SELECT v FROM t"}
    u1, u2 = "1" * 24, "2" * 24
    outputs(await _as_owner(http, settings, None, u1, "execute", create, creds))
    outputs(await _as_owner(http, settings, None, u1, "execute", insert, creds))
    assert (tmp_path / f"user-{u1}" / "mine.db").is_file()
    error = step_error(await _as_owner(http, settings, None, u2, "query", read, creds))
    assert "no such table" in error, error
    # A tenant whose id equals the user's id still gets another directory.
    error = step_error(await _as_owner(http, settings, u1, None, "query", read, creds))
    assert "no such table" in error, error
    for url in (f"sqlite:///../user-{u1}/mine.db", f"sqlite:////{tmp_path}/user-{u1}/mine.db"):
        out = await _as_owner(http, settings, None, u2, "query", read, {"url": url})
        assert step_error(out).startswith("sql: "), url
    error = step_error(await _as_owner(http, settings, None, None, "query", read, creds))
    assert "tenant or an owner user" in error, error
    # An id that is not a plain name never spells a path.
    odd = "../" + u1
    error = step_error(await _as_owner(http, settings, odd, None, "query", read, creds))
    assert "no such table" in error, error
    assert sql.sqlite_owner_dir(odd, None).startswith("tenant.")


@pytest.mark.parametrize("driver", ["postgresql", "mariadb", "sqlite"])
async def test_one_step_runs_one_statement_on_every_driver(
    http: httpx.AsyncClient, settings: Settings, driver: str
) -> None:
    """Issue 17: MySQL accepted ``SELECT 1; DROP TABLE x`` in one step."""
    if driver == "postgresql":
        require_server("PostgreSQL", 5432)
        creds = PG
    elif driver == "mariadb":
        require_server("MariaDB", 3306)
        creds = MARIADB
    else:
        creds = {"url": "sqlite:///multi.db"}
    table = f"multi_{uuid.uuid4().hex[:10]}"
    await _exec(http, settings, creds, f"CREATE TABLE {table} (v INTEGER)")
    try:
        for function in ("query", "execute"):
            for statement in (f"SELECT 1; DROP TABLE {table}", f"SELECT 1;DROP TABLE {table};"):
                out = await step(http, settings, "sql", function, {"statement": statement}, creds)
                error = step_error(out)
                assert error.startswith("sql: "), error
                assert "one statement" in error, error
        out = await step(
            http, settings, "sql", "query", {"statement": f"SELECT count(*) AS n FROM {table}"}, creds
        )
        assert outputs(out) == [{"rows": [{"n": 0}], "count": 1}]
    finally:
        await _exec(http, settings, creds, f"DROP TABLE {table}")


@pytest.mark.parametrize("driver", ["postgresql", "mariadb", "sqlite"])
async def test_query_results_over_the_cap_fail_the_step(
    http: httpx.AsyncClient, settings: Settings, driver: str
) -> None:
    """Rows are fetched one at a time (a server-side cursor) and the step fails as soon as they
    pass FLOWYARD_CONNECTOR_MAX_RESULT_BYTES: one huge row, or many small ones."""
    capped = settings.model_copy(update={"connector_max_result_bytes": 64 * 1024})
    if driver == "postgresql":
        require_server("PostgreSQL", 5432)
        creds = PG
        huge = "SELECT repeat('x', 200000) AS v"
        many = "SELECT repeat('y', 100) AS v FROM generate_series(1, 5000)"
    elif driver == "mariadb":
        require_server("MariaDB", 3306)
        creds = MARIADB
        huge = "SELECT repeat('x', 200000) AS v"
        many = "SELECT repeat('y', 100) AS v FROM seq_1_to_5000"
    else:
        creds = {"url": "sqlite:///caps.db"}
        huge = "SELECT hex(zeroblob(100000)) AS v"
        many = (
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) "
            "SELECT hex(zeroblob(50)) AS v FROM n"
        )
    for statement in (huge, many):
        fields = {"statement": statement, "maxRows": 100_000}
        error = step_error(await step(http, capped, "sql", "query", fields, creds))
        assert error == "sql: the result exceeds 65536 bytes (FLOWYARD_CONNECTOR_MAX_RESULT_BYTES)", error
    out = await step(http, capped, "sql", "query", {"statement": "SELECT 1 AS one"}, creds)
    assert outputs(out) == [{"rows": [{"one": 1}], "count": 1}]
